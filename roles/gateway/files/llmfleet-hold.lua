-- llmfleet.vllm.gateway: hold a slot's new requests while a pivot has it closed (issue 44), instead of answering 503.
--
-- The state of a slot's window (on a fleet gateway: the fleet's, named fleet) is a one-line file the gateway role's
-- entry point `hold` writes (under HAProxy's chroot, so that every worker reads the same one, also a worker that a
-- reload retired with requests still held):
--   closed ENDS HOLD_S HOLD_MAX   the slot is closed for a switch: hold its requests (a stale file stops at ENDS)
--   open PORT ENDS                the slot admits again on PORT: a held request goes there, also from a retired worker
-- A request is held only when no server of its slot's backend can take it and the file says closed; it waits at most
-- HOLD_S from its arrival, and at most HOLD_MAX wait per slot in a worker (the pivot's gateway_hold_s and _max). Past
-- a bound, or once the file is gone, it falls through to the backend, whose 503 (with Retry-After) the configuration
-- gives. txn.hold says what happened (the access log's line carries it), and a line of its own says it at once.

local HOLD_DIR = "/llmfleet-hold/"  -- /var/lib/haproxy/llmfleet-hold seen from the chroot
local POLL_S = 0.1
local states = {}  -- slot -> {read_at, state, port, ends}
-- slot -> {id -> arrival} of the requests held now in this worker. An entry whose client went away while held is never
-- removed by its own action (HAProxy ends the action with the stream): it counts until its bound has passed.
local holding = {}
local next_id = 0

local function clock()
    local now = core.now()
    return now.sec + now.usec / 1000000
end

local function parse(line)
    local ends, hold_s, hold_max = line:match("^closed (%d+) (%d+) (%d+)$")
    if ends then
        return {state = "closed", ends = tonumber(ends), hold_s = tonumber(hold_s), hold_max = tonumber(hold_max)}
    end
    local port, open_ends = line:match("^open (%d+) (%d+)$")
    if port then
        return {state = "open", port = tonumber(port), ends = tonumber(open_ends)}
    end
    return {}
end

-- The slot's window as its file says, read at most every POLL_S; expired or unreadable: no window.
local function window(slot, now)
    local known = states[slot]
    if known and now - known.read_at < POLL_S then
        return known
    end
    local found = {}
    local handle = io.open(HOLD_DIR .. slot, "r")
    if handle then
        found = parse(handle:read("l") or "")
        handle:close()
    end
    if found.ends == nil or found.ends < now then
        found = {}
    end
    found.read_at = now
    states[slot] = found
    return found
end

local function serves(backend)
    for _, server in pairs(backend.servers) do
        local status = server:get_stats()["status"] or ""
        if status == "no check" or status:sub(1, 2) == "UP" then
            return true
        end
    end
    return false
end

-- What the hold did, on the request and as a log line of its own at once (the access log's line comes when the answer
-- has ended): the pivot counts the slot's held requests and their waits from these (module gateway_window).
local function verdict(txn, slot, text)
    txn:set_var("txn.hold", text)
    core.Info("llmfleet-hold slot=" .. slot .. " " .. text)
end

core.register_action("llmfleet_hold", {"http-req"}, function(txn)
    local name = txn:get_var("txn.backend") or ""
    -- A host's gateway: the slot's backend slot_<slot>; a fleet gateway: its one backend, fleet, whose window the
    -- rollout writes (a fleet gateway has no slots).
    local slot, backend = name:match("^slot_(.+)$") or name:match("^fleet$"), core.backends[name]
    if slot == nil or backend == nil or serves(backend) then
        return
    end
    local arrived = clock()
    local state = window(slot, arrived)
    if state.state == "open" then  -- admitted, and this worker's server not enabled yet (or never: a retired worker)
        txn:set_var("txn.held_port", state.port)
        return
    end
    if state.state ~= "closed" then
        return
    end
    local hold_s, hold_max = state.hold_s, state.hold_max
    local held, count = holding[slot] or {}, 0
    holding[slot] = held
    for id, since in pairs(held) do
        if arrived - since > hold_s + 1 then
            held[id] = nil
        else
            count = count + 1
        end
    end
    if count >= hold_max then
        verdict(txn, slot, "refused: " .. hold_max .. " held already (gateway_hold_max)")
        return
    end
    next_id = next_id + 1
    local id = next_id
    held[id] = arrived
    local outcome, now
    repeat
        core.msleep(math.floor(POLL_S * 1000))
        now = clock()
        state = window(slot, now)
        if serves(backend) then
            outcome = "served"
        elseif state.state == "open" then
            outcome = "open"
        elseif state.state ~= "closed" then
            outcome = "ended"
        elseif now - arrived >= hold_s then
            outcome = "time"
        end
    until outcome
    held[id] = nil
    local waited = string.format("%.1f s", now - arrived)
    if outcome == "open" then
        txn:set_var("txn.held_port", state.port)
    end
    if outcome == "time" then
        verdict(txn, slot, "refused: waited " .. waited .. " of " .. hold_s .. " s (gateway_hold_s)")
    elseif outcome == "ended" then
        verdict(txn, slot, "ended: waited " .. waited .. ", the slot's window closed without admitting")
    else
        verdict(txn, slot, "held " .. waited)
    end
end)

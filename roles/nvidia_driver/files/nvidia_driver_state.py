# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What NVIDIA driver a host already runs, and whether llmfleet.vllm.nvidia_driver should leave it alone.

    nvidia_driver_state.py USE_LOADED [ROOT]      USE_LOADED: auto, true or false; ROOT (tests): default /

Prints one JSON object. Run by the role on the managed host (ansible.builtin.script) with the host's python3;
standard library only, read-only. A driver counts as preinstalled when /proc/driver/nvidia/version names a loaded
driver and no Debian/Ubuntu package of an NVIDIA kernel module is installed: a cloud image's or a VM's driver
(runfile, built into the kernel, or a vendor image) that packages must not replace. "auto" leaves such a driver
alone; "true" always uses the loaded driver (and fails when none is loaded); "false" manages it with packages.
"""
import json
import os
import re
import stat
import sys

VERSION_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
# Packages that bring an NVIDIA kernel module (what the role itself would install, and the usual others).
MODULE_PACKAGE_RE = re.compile(
    r"^(nvidia-kernel-dkms|nvidia-open-kernel-dkms|nvidia-kernel-open-dkms|nvidia-kernel-source|nvidia-open(-\d+)?"
    r"|cuda-drivers(-\d+)?|nvidia-driver(-\d+.*)?|nvidia-dkms-\d+.*|linux-modules-nvidia-.*|nvidia-kernel-common-\d+.*)$")
MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset")
UVM_NODES = (("nvidia-uvm", 0), ("nvidia-uvm-tools", 1))


def _read(root, path):
    try:
        with open(os.path.join(root, path.lstrip("/")), encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def loaded_version(text):
    """Driver version from /proc/driver/nvidia/version ('' when none)."""
    match = VERSION_RE.search(text or "")
    return match.group(1) if match else ""


def char_devices(text):
    """{name: major} of /proc/devices' character devices whose name starts with nvidia."""
    found, in_char = {}, False
    for line in (text or "").splitlines():
        if line.startswith("Character devices:"):
            in_char = True
            continue
        if line.startswith("Block devices:") or not line.strip():
            in_char = False
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[1].startswith("nvidia") and parts[0].isdigit():
            found[parts[1]] = int(parts[0])
    return found


def module_state(root, name, builtin_list):
    """'module' (loadable, loaded), 'builtin' (compiled into the kernel) or 'absent'."""
    base = os.path.join(root, "sys/module", name)
    if os.path.exists(os.path.join(base, "initstate")):
        return "module"
    if os.path.isdir(base) or name in builtin_list:
        return "builtin"
    return "absent"


def builtin_modules(root, kernel):
    text = _read(root, "/lib/modules/%s/modules.builtin" % kernel) or ""
    return {os.path.basename(line.strip())[:-3].replace("-", "_") for line in text.splitlines() if line.strip().endswith(".ko")}


def driver_packages(text):
    """Installed packages (dpkg status text) that bring an NVIDIA kernel module."""
    found = []
    for stanza in (text or "").split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if fields.get("Status") == "install ok installed" and MODULE_PACKAGE_RE.match(fields.get("Package", "")):
            found.append(fields["Package"])
    return sorted(found)


def uvm_nodes(root, major):
    """For /dev/nvidia-uvm and -tools: 'ok' (character device of the right numbers), 'wrong', or 'missing'."""
    result = {}
    for name, minor in UVM_NODES:
        try:
            st = os.stat(os.path.join(root, "dev", name))
        except OSError:
            result[name] = "missing"
            continue
        right = stat.S_ISCHR(st.st_mode) and major is not None and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)
        result[name] = "ok" if right else "wrong"
    return result


def decide(state, use_loaded):
    """(use the loaded driver?, why) for nvidia_driver_use_loaded = auto | true | false."""
    loaded = bool(state["loaded_version"])
    if use_loaded == "false":
        return False, "nvidia_driver_use_loaded is false: the role manages the driver with packages"
    if use_loaded == "true":
        if not loaded:
            return False, "nvidia_driver_use_loaded is true but no NVIDIA driver is loaded (/proc/driver/nvidia/version)"
        return True, "nvidia_driver_use_loaded is true: using the loaded driver %s" % state["loaded_version"]
    if not loaded:
        return False, "no NVIDIA driver loaded: the role installs one"
    if state["driver_packages"]:
        return False, "driver %s is loaded and packaged (%s): the role manages it" % (
            state["loaded_version"], ", ".join(state["driver_packages"]))
    how = "built into the kernel" if state["modules"]["nvidia"] == "builtin" else "not from a package"
    return True, "driver %s is loaded and %s: left alone" % (state["loaded_version"], how)


def read_state(root="/", use_loaded="auto", kernel=None):
    kernel = kernel or os.uname().release
    devices = char_devices(_read(root, "/proc/devices"))
    builtin = builtin_modules(root, kernel)
    state = {
        "loaded_version": loaded_version(_read(root, "/proc/driver/nvidia/version")),
        "modules": {name: module_state(root, name, builtin) for name in MODULES},
        "char_devices": devices,
        "driver_packages": driver_packages(_read(root, "/var/lib/dpkg/status")),
        "uvm_nodes": uvm_nodes(root, devices.get("nvidia-uvm")),
    }
    # A uvm driver that registered its character device is active, whether or not /sys/module shows it.
    if state["modules"]["nvidia_uvm"] == "absent" and "nvidia-uvm" in devices:
        state["modules"]["nvidia_uvm"] = "builtin"
    state["use_loaded"], state["reason"] = decide(state, use_loaded)
    return state


def main(argv):
    use_loaded = argv[1] if len(argv) > 1 else "auto"
    if use_loaded not in ("auto", "true", "false"):
        print(json.dumps({"failed": True, "msg": "USE_LOADED must be auto, true or false"}))
        return 2
    print(json.dumps(read_state(argv[2] if len(argv) > 2 else "/", use_loaded), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# Shared by the device tool's scripts (tools/device/gpuhost.sh, vllm_h200.sh and their bundle builders); sourced.

# run_phases DISPATCH PHASE...: DISPATCH PHASE runs one phase; the first failing phase skips the rest but `pack`.
# Exits with the first failure's status.
run_phases() {
  local dispatch=$1 phase rc status=0
  shift
  for phase in "$@"; do
    if [ $status -ne 0 ] && [ "$phase" != pack ]; then continue; fi
    step "$phase"
    "$dispatch" "$phase"
    rc=$?
    echo "===== $phase: rc $rc ($(date -u +%T))"
    [ $rc -eq 0 ] || status=$rc
  done
  exit $status
}

# chunk_bundle ROOT CHUNK_MIB SMALL...: ROOT/bundle.tar split over .whl/c00, c01, ... (each at most CHUNK_MIB; c00 also
# holds the SMALL files of ROOT and SHA256SUMS of the tar, the small files and every part), for one carry per call.
chunk_bundle() {
  local root=$1 chunk=$(($2 * 1024 * 1024)) small=0 f part n
  shift 2
  for f in "$@"; do small=$((small + $(stat -c %s "$root/$f"))); done
  mkdir -p .whl/c00
  head -c $((chunk - small - 65536)) "$root/bundle.tar" > .whl/c00/bundle.part00
  tail -c +$((chunk - small - 65536 + 1)) "$root/bundle.tar" | split -b "$chunk" -d -a 2 --numeric-suffixes=1 - "$root/bundle.part"
  for part in "$root"/bundle.part[0-9][0-9]; do
    n=${part##*part}
    mkdir -p ".whl/c$n"
    mv "$part" ".whl/c$n/"
  done
  for f in "$@"; do cp "$root/$f" .whl/c00/; done
  (cd "$root" && sha256sum bundle.tar "$@") > .whl/c00/SHA256SUMS
  (cd .whl && for n in c[0-9][0-9]; do sha256sum "$n"/bundle.part*; done) | sed 's| c[0-9][0-9]/| |' >> .whl/c00/SHA256SUMS
  ls "$root/wheels" | wc -l | sed 's/$/ wheels/'
  du -sb .whl/c[0-9][0-9] | awk '{printf "%s %.1f MiB\n", $2, $1 / 1048576}'
}

# download_wheels DEST ARGS...: pip download, no dependencies, binary wheels for the H200 image (CPython 3.12, manylinux
# x86_64), into DEST.
download_wheels() {
  local dest=$1
  shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_31_x86_64 \
    --platform manylinux_2_34_x86_64 -d "$dest" "$@"
}

# carry_chunk N DEST: move this call's .whl/cNN out of the repo copy into DEST and check its part against SHA256SUMS
# (which chunk 00 brings); prints the chunk number's two digits.
carry_chunk() {
  local n dest=$2
  n=$(printf %02d "$1")
  [ -d ".whl/c$n" ] || { echo "no .whl/c$n in this call" >&2; return 1; }
  mv -f ".whl/c$n"/* "$dest"/ || return 1
  (cd "$dest" && grep " bundle.part$n\$" SHA256SUMS | sha256sum -c - >&2) || return 1
  echo "$n"
}

# new_bundle ROOT: an empty ROOT with wheels/ and skel/, and no chunks of an earlier build.
new_bundle() {
  rm -rf "$1" .whl/c[0-9][0-9]
  mkdir -p "$1/wheels" "$1/skel"
}

#!/bin/sh
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# The GPU host's userland has no sudo. Ansible's become asks for `sudo -H -S -n -u USER CMD...`; the pivot runs the
# JIT cache module as the service user that way (gpuhost.sh pivotprep installs this as /usr/local/bin/sudo; root only).
user=root
while [ $# -gt 0 ]; do
  case "$1" in
    -u) user=$2; shift 2 ;;
    -p) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
exec /usr/sbin/runuser -u "$user" -- "$@"

# Debian package installs for the scripts and harnesses: one set of rules, sourced (bash).
#
#   . "$(dirname "$0")/lib/packages.sh"
#   need_packages [--no-install-recommends] CHECK:PACKAGE[,PACKAGE...] ...
#
# CHECK is what must be there afterwards:
#   a command name  found on PATH or in /usr/sbin or /sbin (daemons live there);
#   /an/absolute/path  a file that exists;
#   py:MOD[+MOD...]  modules /usr/bin/python3 (or python3) imports (e.g. py:ensurepip+venv).
# Only the packages whose check fails are installed, all in one `apt-get install` after one
# `apt-get update`, as root or through sudo, waiting for the dpkg lock (other runs may hold it).
# Returns non-zero (and says so on stderr) when either apt-get fails; the caller decides.
# scripts also call it from Python: tests/support/python/ironic_proxy_testing/packages.py.

have_check() {
  local check=$1
  case $check in
    py:*)
      local py=/usr/bin/python3
      [ -x "$py" ] || py=python3
      local mods=${check#py:}
      "$py" -c "import ${mods//+/, }" 2>/dev/null
      ;;
    /*) [ -e "$check" ] ;;
    *) command -v "$check" >/dev/null 2>&1 || [ -x "/usr/sbin/$check" ] || [ -x "/sbin/$check" ] ;;
  esac
}

need_packages() {
  local recommends=() spec check pkgs missing=()
  if [ "${1:-}" = --no-install-recommends ]; then
    recommends=(--no-install-recommends)
    shift
  fi
  for spec in "$@"; do
    case $spec in
      py:*) check=${spec%:*} ;;
      *) check=${spec%%:*} ;;
    esac
    pkgs=${spec##*:}
    have_check "$check" && continue
    missing+=(${pkgs//,/ })
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  local who=${PACKAGES_WHO:-${0##*/}} sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  echo "$who: installing ${missing[*]} (apt)" >&2
  "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null \
    || { echo "$who: apt-get update failed" >&2; return 1; }
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install \
    -y -qq "${recommends[@]}" "${missing[@]}" >/dev/null \
    || { echo "$who: apt-get install ${missing[*]} failed" >&2; return 1; }
}

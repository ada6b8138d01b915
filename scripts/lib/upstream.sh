# Upstream code at a pinned commit for shell scripts, sourced (bash):
#
#   . "$(dirname "$0")/lib/upstream.sh"
#   tree=$(upstream_tree ironic-image) || exit 1
#
# The same helper as the Python harnesses' (tests/support/python/ironic_proxy_testing/
# upstream.py, which has the rules): the pins in tests/support/upstream-pins, a clone of
# https://github.com/OWNER/NAME cached by commit, or the tree UPSTREAM_<NAME> names. Prints the
# tree's path; fails (non-zero, the reason on stderr naming repository, commit and variable),
# never skips.

upstream_tree() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  python3 "$root/tests/support/python/ironic_proxy_testing/upstream.py" "$1"
}

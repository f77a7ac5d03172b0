# shellcheck shell=bash
# Sourced by the lab's whole-run scripts (run-lab.sh, bench/tta/run-tta.sh), whose settings are
# all environment variables: `sudo run-lab.sh --help` must print them, not start a 40-minute
# run, and an argument meant as a setting must stop the script, not be ignored.
#   script_args SCRIPT "$@"   (SCRIPT: the sourcing script's path, for its header and settings)
script_args() {
  local script=$1
  shift
  (($#)) || return 0
  if [[ $1 == -h || $1 == --help ]]; then
    # The header comment (after the #! line, up to the first line that is not a comment), then
    # every NAME=${NAME...} line: each setting with its default and comment.
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$script"
    echo
    echo "Settings (environment variables), with their defaults:"
    grep -E '^(export )?[A-Z_]+=\$\{' "$script" | sed -E 's/^export //'
    exit 0
  fi
  echo "$(basename "$script"): takes no arguments (got '$1'): its settings are environment" \
    "variables; --help lists them" >&2
  exit 2
}

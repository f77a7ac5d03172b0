# shellcheck shell=bash
# Sourced by the bench scripts, so that each answers --help from its own header comment.
#   script_header SCRIPT      prints SCRIPT's header comment: after the #! line, up to the first
#                             line that is not a comment
#   script_args SCRIPT "$@"   for the whole-run scripts (bench/lab/run-lab.sh,
#                             bench/tta/run-tta.sh), whose settings are all environment
#                             variables: --help prints the header and every setting with its
#                             default; any other argument stops the script. `sudo run-lab.sh
#                             --help` must not start a 40-minute run, and an argument meant as
#                             a setting must not be ignored.
script_header() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$1"
}

script_args() {
  local script=$1
  shift
  (($#)) || return 0
  if [[ $1 == -h || $1 == --help ]]; then
    script_header "$script"
    echo
    echo "Settings (environment variables), with their defaults:"
    # Every NAME=${NAME...} line: each setting with its default and comment.
    grep -E '^(export )?[A-Z_]+=\$\{' "$script" | sed -E 's/^export //'
    exit 0
  fi
  echo "$(basename "$script"): takes no arguments (got '$1'): its settings are environment" \
    "variables; --help lists them" >&2
  exit 2
}

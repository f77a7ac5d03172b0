#!/bin/sh
# Open MPI launch agent (plm_rsh_agent) for the tail lab: "hosts" are lab namespace names, and
# "logging in" is `ip netns exec`. mpirun calls it as: netns-agent.sh [ssh-style options] HOST CMD...
while [ $# -gt 0 ]; do
  case $1 in
    -*) shift ;;
    *) break ;;
  esac
done
host=$1
shift
# Only our own namespaces: refuse anything else rather than reach for a real host.
case $host in
  "${OLAB_PREFIX:-olab}"-r[0-9]*) ;;
  *) echo "netns-agent.sh: not a lab namespace: $host" >&2; exit 1 ;;
esac
exec ip netns exec "$host" /bin/sh -c "$*"

#!/bin/sh
# Slurm Prolog for nodes that serve an elastic Horovod job through Consul.
#
# Runs as root on each node when Slurm hands it to a job: make sure the node
# agent runs (registering the node with its slot count) and lift a drain an
# earlier epilog left, so discovery lists the node and horovodrun grows the
# job onto it.  Configure with Prolog=/etc/slurm/hvd-elastic-prolog.sh in
# slurm.conf.  A failing prolog drains the node in Slurm, so only a broken
# setup fails here; Consul being briefly unreachable is logged, not fatal.
#
# Environment (all optional):
#   HVD_ELASTIC_BIN              hvd-elastic executable (default /opt/hvd-elastic/.venv/bin/hvd-elastic)
#   HVD_ELASTIC_NODE_AGENT_UNIT  systemd unit to start; empty: the agent is managed elsewhere
#                                (default hvd-elastic-node-agent.service)
#   CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN_FILE, HVD_ELASTIC_SERVICE  as for hvd-elastic itself
set -u
BIN=${HVD_ELASTIC_BIN:-/opt/hvd-elastic/.venv/bin/hvd-elastic}
UNIT=${HVD_ELASTIC_NODE_AGENT_UNIT-hvd-elastic-node-agent.service}

if [ -n "$UNIT" ]; then
    systemctl start "$UNIT" || { echo "hvd-elastic prolog: cannot start $UNIT" >&2; exit 1; }
fi
# The agent may need a moment to register before maintenance can be lifted.
for _ in 1 2 3 4 5 6 7 8 9 10; do
    "$BIN" undrain >/dev/null 2>&1 && exit 0
    sleep 1
done
echo "hvd-elastic prolog: could not undrain node ${SLURMD_NODENAME:-$(hostname)}:" >&2
"$BIN" undrain >&2
exit 0

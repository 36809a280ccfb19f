#!/bin/sh
# Slurm Epilog for nodes that serve an elastic Horovod job through Consul.
#
# Runs as root on each node when Slurm takes it back: drain the node first
# (Consul maintenance: discovery drops it and horovodrun removes it
# gracefully, survivors keep their in-memory state, no rollback), give
# horovodrun a moment to reset without it, then stop the node agent, which
# deregisters the service.  Configure with Epilog=/etc/slurm/hvd-elastic-epilog.sh.
#
# Environment (all optional):
#   HVD_ELASTIC_BIN              hvd-elastic executable (default /opt/hvd-elastic/.venv/bin/hvd-elastic)
#   HVD_ELASTIC_NODE_AGENT_UNIT  systemd unit to stop; empty: leave the agent running
#                                (default hvd-elastic-node-agent.service)
#   HVD_ELASTIC_DRAIN_GRACE      seconds between drain and stop (default 5; Horovod
#                                polls discovery every second)
#   CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN_FILE, HVD_ELASTIC_SERVICE  as for hvd-elastic itself
set -u
BIN=${HVD_ELASTIC_BIN:-/opt/hvd-elastic/.venv/bin/hvd-elastic}
UNIT=${HVD_ELASTIC_NODE_AGENT_UNIT-hvd-elastic-node-agent.service}
GRACE=${HVD_ELASTIC_DRAIN_GRACE:-5}

if "$BIN" drain --reason "slurm job ${SLURM_JOB_ID:-?} ended on ${SLURMD_NODENAME:-$(hostname)}"; then
    sleep "$GRACE"
else
    echo "hvd-elastic epilog: drain failed; stopping the agent anyway" >&2
fi
if [ -n "$UNIT" ]; then
    systemctl stop "$UNIT" || echo "hvd-elastic epilog: cannot stop $UNIT" >&2
fi
exit 0

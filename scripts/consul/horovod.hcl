# Example Consul service definition for a training node (drop it into the
# Consul agent's config directory, e.g. /etc/consul.d/, and `consul reload`).
#
# The node agent (`hvd-elastic node-agent`, scripts/systemd/) registers the same
# service dynamically, with the slot count detected from the GPUs and a TTL
# check driven by local health probes; prefer it.  This static form suits sites
# that manage services only through configuration management: it needs
# something else to keep the TTL check passing, for example
#   consul services register / `curl -X PUT .../v1/agent/check/pass/service:horovod`
# from a cron job or health daemon.
#
# What discovery (`discovery/consul_hosts`) relies on:
#   name          the service horovodrun discovers (--service, default "horovod")
#   meta.slots    processes to start on this node: a positive integer
#   checks        every check must be passing for the node to be listed;
#                 `hvd-elastic drain` adds a maintenance check on top.
service {
  name = "horovod"
  id   = "horovod"
  tags = ["gpu"]

  meta = {
    slots     = "8"
    gpu_model = "NVIDIA H100 80GB HBM3"
  }

  check {
    name   = "horovod node health"
    ttl    = "30s"
    status = "critical"   # not schedulable until something reports healthy
    deregister_critical_service_after = "10m"
  }
}

"""The service's health in Consul, read and judged: what discovery, its watcher and training share.

Stdlib only, no command line (no argparse, no :mod:`hvd_elastic.options`): a
training worker imports it to follow its peers' hosts, discovery to print them.

* :mod:`.hosts` -- pure rules: health entries to validated, merged host lines.
* :mod:`.query` -- the typed health query of the service and the one call that reads it.
* :mod:`.variables` -- the settings that variables give (discovery's flags default to them; a worker reads
  them alone).
* :mod:`.watch` -- following the health with one blocking query, by Consul's rules.
* :mod:`.lost` -- Consul's verdict that a host of a running world failed its health checks.
"""

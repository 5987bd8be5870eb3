"""phaselens, the application layer: the ``phaselens`` command (:mod:`phaselens.cli`, one module per
command group), the demo (:mod:`phaselens.demo`) and the service process that composes the collector
with the HTTP API's analytics reads, the report scheduler and the Prometheus export
(:mod:`phaselens.api`). It imports every layer below it (dashboard, analytics, collector, serving);
none of them imports it. Layers and contracts: docs/ARCHITECTURE.md.
"""

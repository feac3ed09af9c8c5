"""Exporters: a simulated pipeline as JSON, a Chrome trace, a Gantt chart, a text timeline or an
animated HTML page; a chosen layout as Megatron-LM arguments or a torchtitan job config; the
results page. Formatting only: every number comes from the service or the core."""

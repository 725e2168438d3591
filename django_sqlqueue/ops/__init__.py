"""Operating the queue: system checks, metrics, tracing, plans and the diagnosis of a job or the fleet.

Nothing here is on the hot path except :mod:`.tracing`'s span around each run, which is a no-op
unless OpenTelemetry is installed and configured.
"""

"""Global view of workers: liveness, load, in-flight bookings, routing decisions."""

"""The discrete-event pipeline simulator: ops, schedule generators and their registry, the
engine, metrics, closed forms, the action-CSV format and in-flight activation profiles."""

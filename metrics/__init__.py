"""Live metrics: a plain-Python core shared with brokerd, and the console's dashboards (issue #7)."""

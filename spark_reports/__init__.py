"""Usage reports: PySpark jobs run by Celery, delivered by email (issue #8)."""

"""The admin API of brokerd: HTTP + JSON on ``--admin HOST:PORT`` (see ``server.py``)."""

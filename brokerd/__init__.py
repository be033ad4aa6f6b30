"""brokerd: the MQTT 3.1.1 + 5.0 broker daemon of the hub."""

__version__ = "0.1.0"

"""URL converters: MQTT client ids may hold any character, "/" included."""


class ClientIdConverter:
    """One path segment: "~" is written "~7E" and "/" "~2F", so any client id
    round-trips through a URL (percent-encoded slashes do not survive servers)."""

    regex = r"[^/]+"

    def to_python(self, value: str) -> str:
        return value.replace("~2F", "/").replace("~7E", "~")

    def to_url(self, value: str) -> str:
        return value.replace("~", "~7E").replace("/", "~2F")

"""MQTT 5 properties: identifiers, wire types and where each is allowed.

Properties are held in plain dicts keyed by identifier. Values are ints,
strs or bytes; the two properties that may repeat are lists:
``USER_PROPERTY`` -> ``[(key, value), ...]`` and, in PUBLISH only,
``SUBSCRIPTION_IDENTIFIER`` -> ``[int, ...]``.
"""

PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

# wire types
BYTE, U16, U32, VARINT, UTF8, BINARY, PAIR = range(7)

# packet kinds a property may appear in ("will" = the will properties of CONNECT)
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15
WILL = 16
_ACKS = {PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK}

TYPES: dict[int, int] = {}
ALLOWED: dict[int, frozenset] = {}
NAMES: dict[int, str] = {}


def _p(ident, name, wire, where):
    TYPES[ident] = wire
    ALLOWED[ident] = frozenset(where)
    NAMES[ident] = name


_p(PAYLOAD_FORMAT_INDICATOR, "payload_format_indicator", BYTE, {PUBLISH, WILL})
_p(MESSAGE_EXPIRY_INTERVAL, "message_expiry_interval", U32, {PUBLISH, WILL})
_p(CONTENT_TYPE, "content_type", UTF8, {PUBLISH, WILL})
_p(RESPONSE_TOPIC, "response_topic", UTF8, {PUBLISH, WILL})
_p(CORRELATION_DATA, "correlation_data", BINARY, {PUBLISH, WILL})
_p(SUBSCRIPTION_IDENTIFIER, "subscription_identifier", VARINT, {PUBLISH, SUBSCRIBE})
_p(SESSION_EXPIRY_INTERVAL, "session_expiry_interval", U32, {CONNECT, CONNACK, DISCONNECT})
_p(ASSIGNED_CLIENT_IDENTIFIER, "assigned_client_identifier", UTF8, {CONNACK})
_p(SERVER_KEEP_ALIVE, "server_keep_alive", U16, {CONNACK})
_p(AUTHENTICATION_METHOD, "authentication_method", UTF8, {CONNECT, CONNACK, AUTH})
_p(AUTHENTICATION_DATA, "authentication_data", BINARY, {CONNECT, CONNACK, AUTH})
_p(REQUEST_PROBLEM_INFORMATION, "request_problem_information", BYTE, {CONNECT})
_p(WILL_DELAY_INTERVAL, "will_delay_interval", U32, {WILL})
_p(REQUEST_RESPONSE_INFORMATION, "request_response_information", BYTE, {CONNECT})
_p(RESPONSE_INFORMATION, "response_information", UTF8, {CONNACK})
_p(SERVER_REFERENCE, "server_reference", UTF8, {CONNACK, DISCONNECT})
_p(REASON_STRING, "reason_string", UTF8, {CONNACK, DISCONNECT, AUTH} | _ACKS)
_p(RECEIVE_MAXIMUM, "receive_maximum", U16, {CONNECT, CONNACK})
_p(TOPIC_ALIAS_MAXIMUM, "topic_alias_maximum", U16, {CONNECT, CONNACK})
_p(TOPIC_ALIAS, "topic_alias", U16, {PUBLISH})
_p(MAXIMUM_QOS, "maximum_qos", BYTE, {CONNACK})
_p(RETAIN_AVAILABLE, "retain_available", BYTE, {CONNACK})
_p(USER_PROPERTY, "user_property", PAIR, set(range(1, 17)))
_p(MAXIMUM_PACKET_SIZE, "maximum_packet_size", U32, {CONNECT, CONNACK})
_p(WILDCARD_SUBSCRIPTION_AVAILABLE, "wildcard_subscription_available", BYTE, {CONNACK})
_p(SUBSCRIPTION_IDENTIFIER_AVAILABLE, "subscription_identifier_available", BYTE, {CONNACK})
_p(SHARED_SUBSCRIPTION_AVAILABLE, "shared_subscription_available", BYTE, {CONNACK})

# Properties of a PUBLISH that travel with the message from publisher to subscribers.
FORWARDED = frozenset({PAYLOAD_FORMAT_INDICATOR, MESSAGE_EXPIRY_INTERVAL, CONTENT_TYPE, RESPONSE_TOPIC,
                       CORRELATION_DATA, USER_PROPERTY})
# Properties a server drops from acks when the client set Request Problem Information = 0.
PROBLEM_INFORMATION = frozenset({REASON_STRING, USER_PROPERTY})

# Session Expiry Interval that never ends (MQTT 5.0 3.1.2.11.2); also the cap of every
# other u32 interval
NEVER = 0xFFFFFFFF

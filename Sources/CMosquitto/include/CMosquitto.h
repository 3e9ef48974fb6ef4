#ifndef BLECONTROL_CMOSQUITTO_H
#define BLECONTROL_CMOSQUITTO_H
// libmosquitto (Debian's libmosquitto1), opened with dlopen when a board
// file asks for the MQTT transport: the daemon runs, and its package
// installs, on a board that has no MQTT and no libmosquitto. The
// declarations are libmosquitto 2.0's (mosquitto.h, soname
// libmosquitto.so.1, whose ABI the soname promises); only what the
// transport uses.
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mosquitto;
struct mosquitto_message {
    int mid;
    char *topic;
    void *payload;
    int payloadlen;
    int qos;
    bool retain;
};

enum {
    BC_MOSQ_ERR_SUCCESS = 0,
    BC_MOSQ_ERR_NO_CONN = 4,
    BC_MOSQ_ERR_CONN_LOST = 7,
    BC_MOSQ_ERR_ERRNO = 14,
    BC_MOSQ_OPT_PROTOCOL_VERSION = 1,
    BC_MOSQ_OPT_TCP_NODELAY = 11,
    BC_MQTT_PROTOCOL_V5 = 5,
    // Subscription options (MQTT 5, mqtt_protocol.h).
    BC_MQTT_SUB_OPT_NO_LOCAL = 0x04,
    BC_MQTT_SUB_OPT_SEND_RETAIN_NEVER = 0x20,
    BC_MOSQ_ERR_INVAL = 3,
    // MQTT 5 property identifiers (mqtt_protocol.h).
    BC_MQTT_PROP_MAXIMUM_PACKET_SIZE = 39,
};

/// The functions, resolved from the library.
struct bc_mosquitto_api {
    int major, minor, revision;
    int (*lib_init)(void);
    struct mosquitto *(*new_)(const char *id, bool clean_session, void *obj);
    void (*destroy)(struct mosquitto *mosq);
    void (*user_data_set)(struct mosquitto *mosq, void *obj);
    int (*int_option)(struct mosquitto *mosq, int option, int value);
    int (*will_set)(struct mosquitto *mosq, const char *topic, int payloadlen, const void *payload, int qos, bool retain);
    int (*username_pw_set)(struct mosquitto *mosq, const char *username, const char *password);
    int (*tls_set)(struct mosquitto *mosq, const char *cafile, const char *capath, const char *certfile, const char *keyfile,
                   int (*pw_callback)(char *buf, int size, int rwflag, void *userdata));
    int (*connect_async)(struct mosquitto *mosq, const char *host, int port, int keepalive);
    int (*reconnect_async)(struct mosquitto *mosq);
    int (*disconnect)(struct mosquitto *mosq);
    int (*publish)(struct mosquitto *mosq, int *mid, const char *topic, int payloadlen, const void *payload, int qos, bool retain);
    int (*subscribe_v5)(struct mosquitto *mosq, int *mid, const char *sub, int qos, int options, const void *properties);
    int (*loop_read)(struct mosquitto *mosq, int max_packets);
    int (*loop_write)(struct mosquitto *mosq, int max_packets);
    int (*loop_misc)(struct mosquitto *mosq);
    int (*socket)(struct mosquitto *mosq);
    bool (*want_write)(struct mosquitto *mosq);
    void (*connect_callback_set)(struct mosquitto *mosq, void (*on_connect)(struct mosquitto *, void *, int));
    void (*disconnect_callback_set)(struct mosquitto *mosq, void (*on_disconnect)(struct mosquitto *, void *, int));
    void (*message_callback_set)(struct mosquitto *mosq, void (*on_message)(struct mosquitto *, void *, const struct mosquitto_message *));
    void (*subscribe_callback_set)(struct mosquitto *mosq, void (*on_subscribe)(struct mosquitto *, void *, int mid, int qos_count, const int *granted_qos));
    const char *(*strerror)(int mosq_errno);
    const char *(*reason_string)(int reason_code);
    int (*connect_bind_v5)(struct mosquitto *mosq, const char *host, int port, int keepalive, const char *bind_address, const void *properties);
    int (*property_add_int32)(void **proplist, int identifier, uint32_t value);
    void (*property_free_all)(void **proplist);
};

/// Makes every CONNECT of `mosq` from now on (connect_async and
/// reconnect_async alike) carry MQTT 5's Maximum Packet Size property:
/// libmosquitto 2.0 has no call that sets CONNECT properties without
/// connecting (blocking) at once, so this hands them to
/// mosquitto_connect_bind_v5 with no host, which stores them before it
/// refuses the missing host (lib/connect.c, 2.0.11 to 2.0.20). Returns 0
/// when stored, else a libmosquitto error code.
int bc_mosquitto_set_maximum_packet_size(const struct bc_mosquitto_api *api, struct mosquitto *mosq, uint32_t size);

/// Opens libmosquitto.so.1 once (thread-safe) and returns its functions,
/// or NULL with the reason in `error` (a missing library, a missing
/// symbol, a version before 2.0, which has no MQTT 5).
const struct bc_mosquitto_api *bc_mosquitto_load(char *error, size_t error_size);

#endif

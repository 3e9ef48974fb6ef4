#define _GNU_SOURCE
#include "CMosquitto.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static struct bc_mosquitto_api api;
static char load_error[256];
static bool loaded;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void *resolve(void *library, const char *name) {
    void *symbol = dlsym(library, name);
    if (!symbol && !load_error[0]) snprintf(load_error, sizeof load_error, "libmosquitto.so.1 has no %s", name);
    return symbol;
}

static void load(void) {
    // RTLD_LOCAL: its OpenSSL stays its own.
    void *library = dlopen("libmosquitto.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        snprintf(load_error, sizeof load_error, "cannot load libmosquitto.so.1 (%s); install it: apt install libmosquitto1", dlerror());
        return;
    }
    int (*lib_version)(int *, int *, int *) = (int (*)(int *, int *, int *))resolve(library, "mosquitto_lib_version");
#define BIND(field, name) *(void **)(&api.field) = resolve(library, name)
    BIND(lib_init, "mosquitto_lib_init");
    BIND(new_, "mosquitto_new");
    BIND(destroy, "mosquitto_destroy");
    BIND(user_data_set, "mosquitto_user_data_set");
    BIND(int_option, "mosquitto_int_option");
    BIND(will_set, "mosquitto_will_set");
    BIND(username_pw_set, "mosquitto_username_pw_set");
    BIND(tls_set, "mosquitto_tls_set");
    BIND(connect_async, "mosquitto_connect_async");
    BIND(reconnect_async, "mosquitto_reconnect_async");
    BIND(disconnect, "mosquitto_disconnect");
    BIND(publish, "mosquitto_publish");
    BIND(subscribe_v5, "mosquitto_subscribe_v5");
    BIND(loop_read, "mosquitto_loop_read");
    BIND(loop_write, "mosquitto_loop_write");
    BIND(loop_misc, "mosquitto_loop_misc");
    BIND(socket, "mosquitto_socket");
    BIND(want_write, "mosquitto_want_write");
    BIND(connect_callback_set, "mosquitto_connect_callback_set");
    BIND(disconnect_callback_set, "mosquitto_disconnect_callback_set");
    BIND(message_callback_set, "mosquitto_message_callback_set");
    BIND(subscribe_callback_set, "mosquitto_subscribe_callback_set");
    BIND(strerror, "mosquitto_strerror");
    BIND(reason_string, "mosquitto_reason_string");
    BIND(connect_bind_v5, "mosquitto_connect_bind_v5");
    BIND(property_add_int32, "mosquitto_property_add_int32");
    BIND(property_free_all, "mosquitto_property_free_all");
#undef BIND
    if (load_error[0]) return;
    lib_version(&api.major, &api.minor, &api.revision);
    if (api.major < 2) {
        snprintf(load_error, sizeof load_error, "libmosquitto %d.%d.%d is too old: MQTT 5 needs 2.0 or later", api.major, api.minor, api.revision);
        return;
    }
    api.lib_init();
    loaded = true;
}

const struct bc_mosquitto_api *bc_mosquitto_load(char *error, size_t error_size) {
    pthread_once(&once, load);
    if (!loaded && error && error_size) snprintf(error, error_size, "%s", load_error);
    return loaded ? &api : NULL;
}

int bc_mosquitto_set_maximum_packet_size(const struct bc_mosquitto_api *api, struct mosquitto *mosq, uint32_t size) {
    void *properties = NULL;
    int code = api->property_add_int32(&properties, BC_MQTT_PROP_MAXIMUM_PACKET_SIZE, size);
    if (code != BC_MOSQ_ERR_SUCCESS) return code;
    // No host: the properties are copied, then the call stops with
    // MOSQ_ERR_INVAL before any socket is made.
    code = api->connect_bind_v5(mosq, NULL, 0, 0, NULL, properties);
    api->property_free_all(&properties);
    return code == BC_MOSQ_ERR_INVAL ? BC_MOSQ_ERR_SUCCESS : code;
}

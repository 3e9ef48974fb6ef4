// libdbus-1 for Swift (from libdbus-1-dev; found through pkg-config dbus-1).
#include <dbus/dbus.h>

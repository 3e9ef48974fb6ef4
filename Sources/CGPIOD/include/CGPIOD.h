// libgpiod for Swift (1.6 and 2.x).
#ifndef CGPIOD_H
#define CGPIOD_H
#include <gpiod.h>
#endif

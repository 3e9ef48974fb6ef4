// i2c-dev for Swift: the kernel's headers, not retyped constants.
#ifndef CLINUXI2C_H
#define CLINUXI2C_H
#include <linux/i2c.h>
#include <linux/i2c-dev.h>
#endif

// i2c-dev for Swift: the kernel's headers (constants are never retyped) and
// thin wrappers for the calls Swift cannot make directly (variadic ioctl,
// arrays of struct i2c_msg). SMBus transfers go through libi2c (i2c-tools
// 4.x, `i2c/smbus.h`), whose functions return a negative errno on failure.
//
// Every wrapper returns >= 0 on success and -errno on failure, and retries
// EINTR itself, so that callers never read the thread's errno.
#ifndef CLINUXI2C_H
#define CLINUXI2C_H

#include <stdbool.h>
#include <stdint.h>
#include <linux/i2c.h>
#include <linux/i2c-dev.h>
#include <i2c/smbus.h>

/// One message of an I2C_RDWR transaction.
typedef struct blc_i2c_segment {
    /// Bytes to write, or room for the bytes to read.
    uint8_t *_Nullable buffer;
    uint16_t length;
    /// Read (I2C_M_RD) rather than write.
    bool read;
} blc_i2c_segment;

/// open(path, O_RDWR | O_CLOEXEC): the file descriptor, or -errno.
int blc_i2c_open(const char *_Nonnull path);

/// close(fd): 0 or -errno.
int blc_i2c_close(int fd);

/// ioctl(I2C_FUNCS): 0 or -errno; the adapter's I2C_FUNC_* bits in *funcs.
int blc_i2c_functionality(int fd, unsigned long *_Nonnull funcs);

/// ioctl(I2C_SLAVE): targets later SMBus calls at a 7-bit address.
/// -EBUSY means a kernel driver has claimed the address.
int blc_i2c_set_address(int fd, uint16_t address);

/// ioctl(I2C_RDWR) with `count` messages to one 7-bit address, as a single
/// combined transaction (repeated STARTs, one STOP). 0 or -errno.
int blc_i2c_rdwr(int fd, uint16_t address,
                 blc_i2c_segment *_Nonnull segments, uint32_t count);

/// SMBus transfers to the address set by blc_i2c_set_address (SMBus 3.0 §6.5).
/// Writes return 0, byte/word reads the value, block reads the byte count;
/// any of them -errno on failure.
int blc_smbus_quick_write(int fd);
int blc_smbus_send_byte(int fd, uint8_t value);
int blc_smbus_receive_byte(int fd);
int blc_smbus_write_byte_data(int fd, uint8_t command, uint8_t value);
int blc_smbus_read_byte_data(int fd, uint8_t command);
int blc_smbus_write_word_data(int fd, uint8_t command, uint16_t value);
int blc_smbus_read_word_data(int fd, uint8_t command);
int blc_smbus_write_i2c_block(int fd, uint8_t command, uint8_t length,
                              const uint8_t *_Nonnull values);
int blc_smbus_read_i2c_block(int fd, uint8_t command, uint8_t length,
                             uint8_t *_Nonnull values);

#endif

#include "CLinuxI2C.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

// Syscalls: -1 and errno → -errno, EINTR retried.
#define BLC_SYSCALL(expr)                       \
    do {                                        \
        int _r;                                 \
        do {                                    \
            _r = (int)(expr);                   \
        } while (_r < 0 && errno == EINTR);     \
        return _r < 0 ? -errno : _r;            \
    } while (0)

// libi2c 4.x already returns -errno; only EINTR is retried here.
#define BLC_LIBI2C(expr)                        \
    do {                                        \
        int _r;                                 \
        do {                                    \
            _r = (int)(expr);                   \
        } while (_r == -EINTR);                 \
        return _r;                              \
    } while (0)

int blc_i2c_open(const char *path) {
    BLC_SYSCALL(open(path, O_RDWR | O_CLOEXEC));
}

int blc_i2c_close(int fd) {
    // close() must not be retried on EINTR on Linux: the descriptor is gone.
    return close(fd) < 0 && errno != EINTR ? -errno : 0;
}

int blc_i2c_functionality(int fd, unsigned long *funcs) {
    BLC_SYSCALL(ioctl(fd, I2C_FUNCS, funcs));
}

int blc_i2c_set_address(int fd, uint16_t address) {
    BLC_SYSCALL(ioctl(fd, I2C_SLAVE, (unsigned long)address));
}

int blc_i2c_rdwr(int fd, uint16_t address, blc_i2c_segment *segments, uint32_t count) {
    struct i2c_msg msgs[I2C_RDWR_IOCTL_MAX_MSGS];
    if (count == 0 || count > I2C_RDWR_IOCTL_MAX_MSGS) return -EINVAL;
    for (uint32_t i = 0; i < count; i++) {
        msgs[i].addr = address;
        msgs[i].flags = segments[i].read ? I2C_M_RD : 0;
        msgs[i].len = segments[i].length;
        msgs[i].buf = segments[i].buffer;
    }
    struct i2c_rdwr_ioctl_data data = { .msgs = msgs, .nmsgs = count };
    BLC_SYSCALL(ioctl(fd, I2C_RDWR, &data));
}

int blc_smbus_quick_write(int fd) {
    BLC_LIBI2C(i2c_smbus_write_quick(fd, I2C_SMBUS_WRITE));
}

int blc_smbus_send_byte(int fd, uint8_t value) {
    BLC_LIBI2C(i2c_smbus_write_byte(fd, value));
}

int blc_smbus_receive_byte(int fd) {
    BLC_LIBI2C(i2c_smbus_read_byte(fd));
}

int blc_smbus_write_byte_data(int fd, uint8_t command, uint8_t value) {
    BLC_LIBI2C(i2c_smbus_write_byte_data(fd, command, value));
}

int blc_smbus_read_byte_data(int fd, uint8_t command) {
    BLC_LIBI2C(i2c_smbus_read_byte_data(fd, command));
}

int blc_smbus_write_word_data(int fd, uint8_t command, uint16_t value) {
    BLC_LIBI2C(i2c_smbus_write_word_data(fd, command, value));
}

int blc_smbus_read_word_data(int fd, uint8_t command) {
    BLC_LIBI2C(i2c_smbus_read_word_data(fd, command));
}

int blc_smbus_write_i2c_block(int fd, uint8_t command, uint8_t length, const uint8_t *values) {
    if (length > I2C_SMBUS_BLOCK_MAX) return -EINVAL;
    BLC_LIBI2C(i2c_smbus_write_i2c_block_data(fd, command, length, values));
}

int blc_smbus_read_i2c_block(int fd, uint8_t command, uint8_t length, uint8_t *values) {
    if (length > I2C_SMBUS_BLOCK_MAX) return -EINVAL;
    BLC_LIBI2C(i2c_smbus_read_i2c_block_data(fd, command, length, values));
}

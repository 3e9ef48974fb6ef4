// One GPIO output line over libgpiod, with the same small API for libgpiod
// 1.6 (Debian 12 / Raspberry Pi OS bookworm) and 2.x (Debian 13 / trixie).
// The implementation picks the library API at compile time; Swift only sees
// this header, never gpiod.h, so it does not care which one is installed.
#ifndef CGPIOD_H
#define CGPIOD_H

#include <stdbool.h>
#include <stddef.h>

/// A requested output line (opaque).
typedef struct blc_gpio_line blc_gpio_line;

/// Where opening a line failed.
typedef enum blc_gpio_stage {
    BLC_GPIO_OK = 0,
    /// Opening the chip's character device.
    BLC_GPIO_STAGE_CHIP = 1,
    /// Finding the line: by name (ENOENT: the chip has no such name) or by
    /// offset (EINVAL: the offset is past the chip's last line).
    BLC_GPIO_STAGE_LINE = 2,
    /// Requesting the line as an output (EBUSY: another consumer holds it).
    BLC_GPIO_STAGE_REQUEST = 3,
} blc_gpio_stage;

/// What blc_gpio_line_open found out, filled on success and failure alike.
typedef struct blc_gpio_open_result {
    blc_gpio_stage stage;
    /// errno of the failing call (0 on success).
    int error;
    /// The line's offset once known (looked up by name or given).
    unsigned int offset;
    /// Lines on the chip once it is open (0 if unknown).
    unsigned int num_lines;
} blc_gpio_open_result;

/// Opens the chip at `chip_path` (e.g. "/dev/gpiochip0") and requests one
/// line as an output with consumer label `consumer`, driven to `initial`
/// (logical level: 1 = active) from the moment of the request. The line is
/// `name` if non-NULL, else `offset`. With `active_low`, active means low.
/// Returns NULL on failure; `result` says where and why.
blc_gpio_line *_Nullable blc_gpio_line_open(const char *_Nonnull chip_path,
                                            unsigned int offset,
                                            const char *_Nullable name,
                                            const char *_Nonnull consumer,
                                            bool active_low, int initial,
                                            blc_gpio_open_result *_Nonnull result);

/// Drives the line to its logical level (1 = active). 0 or -errno.
int blc_gpio_line_set(blc_gpio_line *_Nonnull line, int value);

/// Releases the line (it returns to the kernel's default) and frees it.
void blc_gpio_line_close(blc_gpio_line *_Nullable line);

/// The consumer label of whoever holds line `offset` of the chip, copied into
/// `buffer` (empty if unused). 0 or -errno. For naming the holder of a busy line.
int blc_gpio_line_consumer(const char *_Nonnull chip_path, unsigned int offset,
                           char *_Nonnull buffer, size_t size);

/// The label of the chip at `chip_path` (its driver's name for it, e.g.
/// "pinctrl-bcm2711" or "pinctrl-rp1"), copied into `buffer`. 0 or -errno
/// of opening the chip.
int blc_gpio_chip_label(const char *_Nonnull chip_path, char *_Nonnull buffer, size_t size);

/// Looks for the line called `name` on the chip at `chip_path`: 0 with its
/// offset in `offset`, 1 when the chip has no line of that name, -errno
/// when the chip cannot be opened or searched.
int blc_gpio_chip_find_line(const char *_Nonnull chip_path, const char *_Nonnull name,
                            unsigned int *_Nonnull offset);

/// The version of the libgpiod linked at run time, e.g. "1.6.3".
const char *_Nonnull blc_gpio_library_version(void);

#endif

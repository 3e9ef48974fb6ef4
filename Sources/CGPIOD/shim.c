#include "CGPIOD.h"

#include <errno.h>
#include <gpiod.h>
#include <stdlib.h>
#include <string.h>

// Only libgpiod 1.x's gpiod.h defines GPIOD_API; 2.x keeps it internal.
#ifdef GPIOD_API

// ---------------------------------------------------------------- libgpiod 1.x

struct blc_gpio_line {
    struct gpiod_chip *chip;
    struct gpiod_line *line;
};

blc_gpio_line *blc_gpio_line_open(const char *chip_path, unsigned int offset,
                                  const char *name, const char *consumer,
                                  bool active_low, int initial,
                                  blc_gpio_open_result *result) {
    memset(result, 0, sizeof *result);
    result->offset = offset;

    struct gpiod_chip *chip = gpiod_chip_open(chip_path);
    if (!chip) {
        result->stage = BLC_GPIO_STAGE_CHIP;
        result->error = errno;
        return NULL;
    }
    result->num_lines = gpiod_chip_num_lines(chip);

    struct gpiod_line *line;
    if (name) {
        errno = 0;
        line = gpiod_chip_find_line(chip, name);
        if (!line) {
            result->stage = BLC_GPIO_STAGE_LINE;
            result->error = errno ? errno : ENOENT;
            gpiod_chip_close(chip);
            return NULL;
        }
        result->offset = gpiod_line_offset(line);
    } else {
        if (offset >= result->num_lines) {
            result->stage = BLC_GPIO_STAGE_LINE;
            result->error = EINVAL;
            gpiod_chip_close(chip);
            return NULL;
        }
        line = gpiod_chip_get_line(chip, offset);
        if (!line) {
            result->stage = BLC_GPIO_STAGE_LINE;
            result->error = errno;
            gpiod_chip_close(chip);
            return NULL;
        }
    }

    // 1.x values are logical: with ACTIVE_LOW, 1 drives the pin low.
    int flags = active_low ? GPIOD_LINE_REQUEST_FLAG_ACTIVE_LOW : 0;
    if (gpiod_line_request_output_flags(line, consumer, flags, initial ? 1 : 0) < 0) {
        result->stage = BLC_GPIO_STAGE_REQUEST;
        result->error = errno;
        gpiod_chip_close(chip);
        return NULL;
    }

    blc_gpio_line *handle = calloc(1, sizeof *handle);
    if (!handle) {
        result->stage = BLC_GPIO_STAGE_REQUEST;
        result->error = ENOMEM;
        gpiod_line_release(line);
        gpiod_chip_close(chip);
        return NULL;
    }
    handle->chip = chip;
    handle->line = line;
    return handle;
}

int blc_gpio_line_set(blc_gpio_line *handle, int value) {
    return gpiod_line_set_value(handle->line, value ? 1 : 0) < 0 ? -errno : 0;
}

void blc_gpio_line_close(blc_gpio_line *handle) {
    if (!handle) return;
    gpiod_line_release(handle->line);
    // Closing the chip frees its line objects too.
    gpiod_chip_close(handle->chip);
    free(handle);
}

int blc_gpio_line_consumer(const char *chip_path, unsigned int offset,
                           char *buffer, size_t size) {
    if (size == 0) return -EINVAL;
    buffer[0] = '\0';
    struct gpiod_chip *chip = gpiod_chip_open(chip_path);
    if (!chip) return -errno;
    struct gpiod_line *line = gpiod_chip_get_line(chip, offset);
    if (!line) {
        int error = errno;
        gpiod_chip_close(chip);
        return -error;
    }
    const char *consumer = gpiod_line_consumer(line);
    if (consumer) {
        strncpy(buffer, consumer, size - 1);
        buffer[size - 1] = '\0';
    }
    gpiod_chip_close(chip);
    return 0;
}

// The chip's label copied into buffer (size > 0). 0 or -errno.
static int chip_label(struct gpiod_chip *chip, char *buffer, size_t size) {
    strncpy(buffer, gpiod_chip_label(chip), size - 1);
    buffer[size - 1] = '\0';
    return 0;
}

// The offset of the line called name, or -1 with errno set (ENOENT: none).
static int chip_line_offset(struct gpiod_chip *chip, const char *name) {
    struct gpiod_line *line = gpiod_chip_find_line(chip, name);
    return line ? (int)gpiod_line_offset(line) : -1;
}

const char *blc_gpio_library_version(void) {
    return gpiod_version_string();
}

#else

// ---------------------------------------------------------------- libgpiod 2.x

struct blc_gpio_line {
    struct gpiod_line_request *request;
    unsigned int offset;
};

blc_gpio_line *blc_gpio_line_open(const char *chip_path, unsigned int offset,
                                  const char *name, const char *consumer,
                                  bool active_low, int initial,
                                  blc_gpio_open_result *result) {
    memset(result, 0, sizeof *result);
    result->offset = offset;

    struct gpiod_chip *chip = gpiod_chip_open(chip_path);
    if (!chip) {
        result->stage = BLC_GPIO_STAGE_CHIP;
        result->error = errno;
        return NULL;
    }
    struct gpiod_chip_info *info = gpiod_chip_get_info(chip);
    if (info) {
        result->num_lines = (unsigned int)gpiod_chip_info_get_num_lines(info);
        gpiod_chip_info_free(info);
    }

    if (name) {
        errno = 0;
        int found = gpiod_chip_get_line_offset_from_name(chip, name);
        if (found < 0) {
            result->stage = BLC_GPIO_STAGE_LINE;
            result->error = errno ? errno : ENOENT;
            gpiod_chip_close(chip);
            return NULL;
        }
        offset = (unsigned int)found;
        result->offset = offset;
    } else if (result->num_lines > 0 && offset >= result->num_lines) {
        result->stage = BLC_GPIO_STAGE_LINE;
        result->error = EINVAL;
        gpiod_chip_close(chip);
        return NULL;
    }

    struct gpiod_line_settings *settings = gpiod_line_settings_new();
    struct gpiod_line_config *line_config = gpiod_line_config_new();
    struct gpiod_request_config *request_config = gpiod_request_config_new();
    struct gpiod_line_request *request = NULL;
    int error = ENOMEM;
    if (settings && line_config && request_config) {
        // 2.x values are logical too: with active-low, ACTIVE drives the pin low.
        gpiod_line_settings_set_direction(settings, GPIOD_LINE_DIRECTION_OUTPUT);
        gpiod_line_settings_set_active_low(settings, active_low);
        gpiod_line_settings_set_output_value(
            settings, initial ? GPIOD_LINE_VALUE_ACTIVE : GPIOD_LINE_VALUE_INACTIVE);
        gpiod_request_config_set_consumer(request_config, consumer);
        if (gpiod_line_config_add_line_settings(line_config, &offset, 1, settings) < 0) {
            error = errno;
        } else {
            request = gpiod_chip_request_lines(chip, request_config, line_config);
            if (!request) error = errno;
        }
    }
    // Not every 2.x release accepts NULL in its *_free functions.
    if (request_config) gpiod_request_config_free(request_config);
    if (line_config) gpiod_line_config_free(line_config);
    if (settings) gpiod_line_settings_free(settings);
    // A 2.x request owns its own file descriptor; the chip is not needed.
    gpiod_chip_close(chip);

    if (!request) {
        result->stage = BLC_GPIO_STAGE_REQUEST;
        result->error = error;
        return NULL;
    }
    blc_gpio_line *handle = calloc(1, sizeof *handle);
    if (!handle) {
        result->stage = BLC_GPIO_STAGE_REQUEST;
        result->error = ENOMEM;
        gpiod_line_request_release(request);
        return NULL;
    }
    handle->request = request;
    handle->offset = offset;
    return handle;
}

int blc_gpio_line_set(blc_gpio_line *handle, int value) {
    int r = gpiod_line_request_set_value(
        handle->request, handle->offset,
        value ? GPIOD_LINE_VALUE_ACTIVE : GPIOD_LINE_VALUE_INACTIVE);
    return r < 0 ? -errno : 0;
}

void blc_gpio_line_close(blc_gpio_line *handle) {
    if (!handle) return;
    gpiod_line_request_release(handle->request);
    free(handle);
}

int blc_gpio_line_consumer(const char *chip_path, unsigned int offset,
                           char *buffer, size_t size) {
    if (size == 0) return -EINVAL;
    buffer[0] = '\0';
    struct gpiod_chip *chip = gpiod_chip_open(chip_path);
    if (!chip) return -errno;
    struct gpiod_line_info *info = gpiod_chip_get_line_info(chip, offset);
    if (!info) {
        int error = errno;
        gpiod_chip_close(chip);
        return -error;
    }
    const char *consumer = gpiod_line_info_get_consumer(info);
    if (consumer) {
        strncpy(buffer, consumer, size - 1);
        buffer[size - 1] = '\0';
    }
    gpiod_line_info_free(info);
    gpiod_chip_close(chip);
    return 0;
}

// The chip's label copied into buffer (size > 0). 0 or -errno.
static int chip_label(struct gpiod_chip *chip, char *buffer, size_t size) {
    struct gpiod_chip_info *info = gpiod_chip_get_info(chip);
    if (!info) return -errno;
    strncpy(buffer, gpiod_chip_info_get_label(info), size - 1);
    buffer[size - 1] = '\0';
    gpiod_chip_info_free(info);
    return 0;
}

// The offset of the line called name, or -1 with errno set (ENOENT: none).
static int chip_line_offset(struct gpiod_chip *chip, const char *name) {
    return gpiod_chip_get_line_offset_from_name(chip, name);
}

const char *blc_gpio_library_version(void) {
    return gpiod_api_version();
}

#endif

// ------------------------------------------------ both: what the chips hold

int blc_gpio_chip_label(const char *chip_path, char *buffer, size_t size) {
    if (size == 0) return -EINVAL;
    buffer[0] = '\0';
    struct gpiod_chip *chip = gpiod_chip_open(chip_path);
    if (!chip) return -errno;
    int result = chip_label(chip, buffer, size);
    gpiod_chip_close(chip);
    return result;
}

int blc_gpio_chip_find_line(const char *chip_path, const char *name, unsigned int *offset) {
    struct gpiod_chip *chip = gpiod_chip_open(chip_path);
    if (!chip) return -errno;
    errno = 0;
    int found = chip_line_offset(chip, name);
    int result = 0;
    if (found >= 0) {
        *offset = (unsigned int)found;
    } else {
        // Both versions say ENOENT for a name the chip lacks (1.x may leave errno 0).
        result = (errno == 0 || errno == ENOENT) ? 1 : -errno;
    }
    gpiod_chip_close(chip);
    return result;
}

/*
 * glibc 2.38 symbols referenced by Debian sid's static Swift runtime
 * (libCoreFoundation.a, lib_FoundationICU.a, libdispatch.a, libswiftCore.a
 * were compiled against glibc 2.42 headers), defined in terms of functions
 * glibc 2.36 (Debian 12 / Raspberry Pi OS bookworm) already has, so that the
 * statically linked binaries load on bookworm as well as on newer systems.
 *
 * Compiled against the bookworm sysroot's headers: there strtol() is plain
 * strtol@GLIBC_2.17 and vsscanf() is __isoc99_vsscanf@GLIBC_2.17.
 *
 * The only behavioural difference of the C23 variants is that they also
 * accept a "0b"/"0B" prefix (base 0 or 2) and that scanf's %i does too; no
 * caller in the runtime parses binary literals.
 */
#include <stdarg.h>
#include <stdint.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

long __isoc23_strtol(const char *s, char **end, int base) { return strtol(s, end, base); }
unsigned long __isoc23_strtoul(const char *s, char **end, int base) { return strtoul(s, end, base); }
long long __isoc23_strtoll(const char *s, char **end, int base) { return strtoll(s, end, base); }
unsigned long long __isoc23_strtoull(const char *s, char **end, int base) { return strtoull(s, end, base); }
intmax_t __isoc23_strtoimax(const char *s, char **end, int base) { return strtoimax(s, end, base); }
uintmax_t __isoc23_strtoumax(const char *s, char **end, int base) { return strtoumax(s, end, base); }

int __isoc23_vsscanf(const char *s, const char *format, va_list ap) { return vsscanf(s, format, ap); }
int __isoc23_sscanf(const char *s, const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    int n = vsscanf(s, format, ap);
    va_end(ap);
    return n;
}

/* BSD strlcpy/strlcat (glibc 2.38): copy at most size-1 bytes, always
   terminate when size > 0, return the length of the string tried to make. */
size_t strlcpy(char *dst, const char *src, size_t size)
{
    size_t length = strlen(src);
    if (size > 0) {
        size_t n = length < size - 1 ? length : size - 1;
        memcpy(dst, src, n);
        dst[n] = '\0';
    }
    return length;
}

size_t strlcat(char *dst, const char *src, size_t size)
{
    size_t used = strnlen(dst, size);
    if (used == size) return size + strlen(src);
    return used + strlcpy(dst + used, src, size - used);
}

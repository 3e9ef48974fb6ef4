"""The peer comparison of the VM tier (Tests/VM/peers.sh runs this in the guest).

The same workload goes to the same i2c-stub bus through three drivers:
Adafruit's CircuitPython PCA9685 library (on Blinka), RPLCD (on smbus2), and
ours (blecontrold, fed BLEControl frames over its TCP transport). The kernel's
i2c and smbus tracepoints count what each put on the bus: transfers (START
to STOP), messages (segments between repeated STARTs) and payload bytes (what
follows the address byte), per servo update and per LCD line.

i2c-stub does SMBus only. Blinka writes with plain write()/I2C_RDWR, which
the stub refuses; when it does, the Adafruit library runs on a stand-in bus
that turns each of its I2C writes into the SMBus transfer with the very same
bytes on the wire (an I2C block write whose command byte is the register),
and the table says so.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

TRACING = "/sys/kernel/tracing"
PCA_ADDRESS = 0x40
LCD_ADDRESS = 0x27
SERVO_UPDATES = 1000
CHANNELS = 8
LCD_LINES = 20
LCD_COLUMNS = 16


def servo_workload():
    """(channel, pulse µs) for every update: 8 channels round robin, each
    update a new value for its channel."""
    return [(i % CHANNELS, 1000 + (i * 37) % 1001) for i in range(SERVO_UPDATES)]


def lcd_workload():
    """(row, text) for every line update; every character changes each time."""
    return [
        (i % 2, "".join(chr(ord("A") + (i + k) % 26) for k in range(LCD_COLUMNS)))
        for i in range(LCD_LINES)
    ]


# --- tracing -----------------------------------------------------------------


def write(path, value):
    with open(path, "w") as f:
        f.write(value)


def trace_start():
    write(f"{TRACING}/tracing_on", "0")
    write(f"{TRACING}/buffer_size_kb", "16384")
    for system in ("i2c", "smbus"):
        write(f"{TRACING}/events/{system}/enable", "1")
    write(f"{TRACING}/trace", "")  # clears the buffer
    write(f"{TRACING}/tracing_on", "1")


def trace_take():
    """Stops tracing and returns the buffer's lines; the buffer is cleared."""
    write(f"{TRACING}/tracing_on", "0")
    with open(f"{TRACING}/trace") as f:
        lines = f.read().splitlines()
    write(f"{TRACING}/trace", "")
    return lines


EVENT = re.compile(r"\s(i2c_write|i2c_read|i2c_reply|i2c_result|smbus_write|smbus_read|smbus_reply|smbus_result): i2c-(\d+) (.*)$")
FIELD = re.compile(r"(\w+)=(-?[0-9a-fx]+)")


class Counts:
    def __init__(self):
        self.transfers = 0
        self.messages = 0
        self.bytes = 0
        self.failed = 0
        self.protocols = {}

    def as_dict(self):
        return dict(transfers=self.transfers, messages=self.messages, bytes=self.bytes,
                    failed=self.failed, protocols=self.protocols)


def count(lines, bus):
    """Counts per address from trace lines of one adapter.

    SMBus transfers are counted at smbus_result (one per transfer), with the
    payload from the protocol (and from smbus_write/reply for block lengths);
    plain I2C transfers at i2c_result, with the messages seen before it.
    """
    per_address = {}
    block_len = None  # l= of the last smbus_write/smbus_reply (block protocols)
    pending_i2c = []  # (address, bytes) of i2c messages since the last i2c_result
    for line in lines:
        m = EVENT.search(line)
        if not m or int(m.group(2)) != bus:
            continue
        event, rest = m.group(1), m.group(3)
        fields = dict(FIELD.findall(rest))
        if event in ("smbus_write", "smbus_reply"):
            block_len = int(fields.get("l", "0"))
        elif event == "smbus_result":
            address = int(fields["a"], 16)
            words = rest.split()
            # i2c-N a= f= c= PROTOCOL rd|wr res=
            protocol, direction = words[3], words[4]
            result = int(fields["res"])
            c = per_address.setdefault(address, Counts())
            c.transfers += 1
            key = f"{protocol} {direction}"
            c.protocols[key] = c.protocols.get(key, 0) + 1
            if result < 0:
                c.failed += 1
            n = block_len or 0
            if protocol == "QUICK":
                messages, payload = 1, 0
            elif protocol == "BYTE":
                messages, payload = 1, 1
            elif protocol == "BYTE_DATA":
                messages, payload = (1, 2) if direction == "wr" else (2, 2)
            elif protocol == "WORD_DATA":
                messages, payload = (1, 3) if direction == "wr" else (2, 3)
            elif protocol == "I2C_BLOCK_DATA":
                # l counts the length byte the kernel keeps in block[0]; the
                # wire carries the command byte and the data.
                messages, payload = (1, n) if direction == "wr" else (2, n)
            elif protocol == "BLOCK_DATA":
                messages, payload = (1, n + 1) if direction == "wr" else (2, n + 1)
            else:
                messages, payload = 1, n
            c.messages += messages
            c.bytes += payload
            block_len = None
        elif event in ("i2c_write", "i2c_reply"):
            pending_i2c.append((int(fields["a"], 16), int(fields.get("l", "0")), event))
        elif event == "i2c_read":
            pass
        elif event == "i2c_result":
            if not pending_i2c:
                continue
            address = pending_i2c[0][0]
            c = per_address.setdefault(address, Counts())
            c.transfers += 1
            c.messages += int(fields.get("n", "1"))
            c.bytes += sum(length for _, length, _ in pending_i2c)
            if int(fields.get("ret", "0")) < 0:
                c.failed += 1
            c.protocols["I2C"] = c.protocols.get("I2C", 0) + 1
            pending_i2c = []
    return per_address


# --- the Adafruit side ---------------------------------------------------------


class SMBusStandIn:
    """busio.I2C's interface over smbus2, for an SMBus-only adapter.

    Each I2C transfer Blinka would make becomes the SMBus transfer with the
    same bytes on the wire: a write of [reg, data...] is an I2C block write
    with command reg, [reg] alone a send-byte, an empty write a quick write,
    and write [reg] then read n an I2C block read."""

    def __init__(self, bus):
        from smbus2 import SMBus

        self.bus = SMBus(bus)

    def try_lock(self):
        return True

    def unlock(self):
        pass

    def writeto(self, address, buffer, *, start=0, end=None):
        data = bytes(buffer[start:end if end is not None else len(buffer)])
        if not data:
            self.bus.write_quick(address)
        elif len(data) == 1:
            self.bus.write_byte(address, data[0])
        else:
            self.bus.write_i2c_block_data(address, data[0], list(data[1:]))

    def readfrom_into(self, address, buffer, *, start=0, end=None):
        end = len(buffer) if end is None else end
        for i in range(start, end):
            buffer[i] = self.bus.read_byte(address)

    def writeto_then_readfrom(self, address, out_buffer, in_buffer, *,
                              out_start=0, out_end=None, in_start=0, in_end=None):
        out = bytes(out_buffer[out_start:out_end if out_end is not None else len(out_buffer)])
        in_end = len(in_buffer) if in_end is None else in_end
        if len(out) != 1:
            raise OSError("stand-in bus: only single-register reads")
        data = self.bus.read_i2c_block_data(address, out[0], in_end - in_start)
        for i, value in enumerate(data):
            in_buffer[in_start + i] = value


def run_adafruit(bus, report):
    import adafruit_pca9685

    row = dict(library="Adafruit CircuitPython PCA9685 %s" % version("adafruit-circuitpython-pca9685"))
    # First the real thing: Blinka's own Linux I2C on /dev/i2c-N.
    try:
        from adafruit_extended_bus import ExtendedI2C

        trace_start()
        pca = adafruit_pca9685.PCA9685(ExtendedI2C(bus), address=PCA_ADDRESS)
        pca.frequency = 50
        row["transport"] = "Blinka %s (ExtendedI2C)" % version("Adafruit-Blinka")
    except Exception as error:  # noqa: BLE001 - what failed is the finding
        trace_take()
        row["blinka_error"] = "%s: %s" % (type(error).__name__, error)
        try:  # the cause under the library's probe
            ExtendedI2C(bus).writeto(PCA_ADDRESS, b"\x00")
        except Exception as cause:  # noqa: BLE001
            row["blinka_error"] += " (Blinka's writeto: %s: %s)" % (type(cause).__name__, cause)
        row["transport"] = "smbus2 stand-in for busio.I2C (Blinka: %s)" % row["blinka_error"]
        trace_start()
        pca = adafruit_pca9685.PCA9685(SMBusStandIn(bus), address=PCA_ADDRESS)
        pca.frequency = 50
    row["init"] = count(trace_take(), bus)
    updates = servo_workload()
    trace_start()
    started = time.monotonic()
    for channel, pulse in updates:
        # The library's servo helper (adafruit_motor) ends in exactly this:
        # a 16-bit duty cycle of the 20 ms frame.
        pca.channels[channel].duty_cycle = round(pulse / 20000 * 0xFFFF)
    row["seconds"] = time.monotonic() - started
    row["servo"] = count(trace_take(), bus)
    report["adafruit"] = row


def run_rplcd(bus, report):
    from RPLCD.i2c import CharLCD

    row = dict(library="RPLCD %s" % version("RPLCD"), transport="smbus2 %s" % version("smbus2"))
    trace_start()
    lcd = CharLCD("PCF8574", LCD_ADDRESS, port=bus, cols=LCD_COLUMNS, rows=2, auto_linebreaks=False)
    row["init"] = count(trace_take(), bus)
    trace_start()
    started = time.monotonic()
    for rowno, text in lcd_workload():
        lcd.cursor_pos = (rowno, 0)
        lcd.write_string(text)
    row["seconds"] = time.monotonic() - started
    row["lcd"] = count(trace_take(), bus)
    report["rplcd"] = row


def version(distribution):
    try:
        from importlib.metadata import version as v

        return v(distribution)
    except Exception:  # noqa: BLE001
        return "?"


# --- our side ------------------------------------------------------------------


def frame(command, *data):
    return bytes([command, len(data)]) + bytes(data)


def run_ours(args, bus, report):
    row = dict(library="BLEControl blecontrold", transport="our i2c-dev backend (TCP frames)")
    socket_path = "/run/blecontrol-vm/peers.sock"
    log = open(os.path.join(args.out, "peers-daemon.log"), "w")
    trace_start()
    daemon = subprocess.Popen(
        [args.daemon, "--board", args.board, "--socket", socket_path, "--tcp", "127.0.0.1:0"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        # Until the control socket answers and the LCD, which initialises on
        # its own thread, is online: its set-up is all on the bus then.
        # Bounded by tries (two minutes and more), not a clock.
        status = None
        for _ in range(1200):
            if daemon.poll() is not None:
                raise RuntimeError("daemon exited with %s: %s" % (daemon.returncode, tail(log.name)))
            try:
                status = json.loads(subprocess.run(
                    [args.cli, "status", "--socket", socket_path, "--json"],
                    capture_output=True, check=True, text=True).stdout)
                if status.get("lcd", {}).get("online"):
                    break
            except (subprocess.CalledProcessError, ValueError):
                pass
            time.sleep(0.1)
        if not (status or {}).get("lcd", {}).get("online"):
            raise RuntimeError("control socket did not answer, or the LCD never came online: %s" % tail(log.name))
        row["init"] = count(trace_take(), bus)
        port = int(status["transports"]["tcp"].rsplit(":", 1)[1])
        connection = socket.create_connection(("127.0.0.1", port))
        connection.sendall(frame(0))  # INIT
        connection.sendall(b"".join(frame(1, ch, 1) for ch in range(CHANNELS)))
        time.sleep(0.5)

        # Idle traffic, to tell it apart from the workload's.
        trace_start()
        time.sleep(2)
        row["idle_2s"] = count(trace_take(), bus)

        updates = servo_workload()
        # Paced slower than the servo path's flush bucket (4 per 20 ms
        # period) so that every update is its own flush, as with the peers.
        trace_start()
        started = time.monotonic()
        for i, (channel, pulse) in enumerate(updates):
            value = pulse - 1000
            connection.sendall(frame(2, channel, value >> 8, value & 0xFF))
            time.sleep(max(0.0, started + (i + 1) * 0.010 - time.monotonic()))
        time.sleep(0.5)
        row["seconds"] = time.monotonic() - started
        row["servo"] = count(trace_take(), bus)

        # The same updates as fast as the socket takes them: the servo path
        # coalesces (latest value per channel wins).
        trace_start()
        connection.sendall(b"".join(frame(2, ch, (p - 1000) >> 8, (p - 1000) & 0xFF) for ch, p in updates))
        time.sleep(2)
        row["servo_burst"] = count(trace_take(), bus)

        trace_start()
        started = time.monotonic()
        for rowno, text in lcd_workload():
            connection.sendall(frame(4, rowno, *text.encode(), 0))
            time.sleep(0.3)
        time.sleep(1)
        row["lcd_seconds"] = time.monotonic() - started
        row["lcd"] = count(trace_take(), bus)
        connection.close()
    except Exception as error:  # noqa: BLE001 - reported in the table
        trace_take()
        row["error"] = "%s: %s" % (type(error).__name__, error)
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            daemon.wait(15)
    report["ours"] = row


def tail(path):
    try:
        with open(path) as f:
            return " ".join(f.read().splitlines()[-2:])
    except OSError:
        return ""


# --- the table -------------------------------------------------------------------


def per(counts, address, n):
    c = counts.get(address) or Counts()
    note = "%d transfers, %d bytes in all" % (c.transfers, c.bytes)
    if c.failed:
        note += ", %d failed" % c.failed
    return "%.2f" % (c.transfers / n), "%.2f" % (c.messages / n), "%.2f" % (c.bytes / n), note


def table(report):
    rows = []

    def add(what, who, counts, address, n, note=""):
        if counts is None:
            return
        t, m, b, totals = per(counts, address, n)
        rows.append((what, who, t, m, b, "; ".join(x for x in (totals, note) if x)))

    a, r, o = report.get("adafruit", {}), report.get("rplcd", {}), report.get("ours", {})
    add("servo update", "Adafruit PCA9685", a.get("servo"), PCA_ADDRESS, SERVO_UPDATES,
        "" if "blinka_error" not in a else "on the smbus2 stand-in")
    add("servo update", "ours, paced 10 ms", o.get("servo"), PCA_ADDRESS, SERVO_UPDATES)
    add("servo update", "ours, burst", o.get("servo_burst"), PCA_ADDRESS, SERVO_UPDATES, "all at once: coalesced")
    add("LCD line (16 ch)", "RPLCD", r.get("lcd"), LCD_ADDRESS, LCD_LINES)
    add("LCD line (16 ch)", "ours", o.get("lcd"), LCD_ADDRESS, LCD_LINES)
    add("PCA9685 init", "Adafruit PCA9685", a.get("init"), PCA_ADDRESS, 1)
    add("PCA9685 init", "ours", o.get("init"), PCA_ADDRESS, 1)
    add("LCD init", "RPLCD", r.get("init"), LCD_ADDRESS, 1)
    add("LCD init", "ours", o.get("init"), LCD_ADDRESS, 1)
    header = ("per", "driver", "transfers", "messages", "bytes", "")
    widths = [max(len(str(x[i])) for x in rows + [header]) for i in range(6)]
    out = ["  ".join(str(x[i]).ljust(widths[i]) for i in range(6)).rstrip() for x in [header] + rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    out.append("(per servo update / per LCD line / per init; bytes: payload after the address byte;")
    out.append(" %d servo updates over %d channels, %d LCD lines; kernel i2c/smbus tracepoints on i2c-stub)"
               % (SERVO_UPDATES, CHANNELS, LCD_LINES))
    for key, row in (("adafruit", a), ("rplcd", r), ("ours", o)):
        if row.get("blinka_error"):
            out.append("Blinka on the stub bus: %s" % row["blinka_error"])
        if row.get("error"):
            out.append("%s failed: %s" % (row.get("library", key), row["error"]))
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bus", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--daemon")
    parser.add_argument("--cli")
    parser.add_argument("--board")
    args = parser.parse_args()

    report = {}
    for name, run in (("adafruit", lambda: run_adafruit(args.bus, report)),
                      ("rplcd", lambda: run_rplcd(args.bus, report))):
        try:
            run()
        except Exception as error:  # noqa: BLE001
            try:
                trace_take()
            except OSError:
                pass
            report.setdefault(name, {})["error"] = "%s: %s" % (type(error).__name__, error)
    if args.daemon:
        run_ours(args, args.bus, report)

    def plain(value):
        if isinstance(value, Counts):
            return value.as_dict()
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        return value

    with open(os.path.join(args.out, "peers.json"), "w") as f:
        json.dump(plain(report), f, indent=2, sort_keys=True)
    text = table(report)
    with open(os.path.join(args.out, "peers-table.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    failed = [row.get("library", key) for key, row in report.items() if row.get("error")]
    if failed:
        print("failed: %s" % ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The control page in a real headless Chromium, end to end: Chromium's own
BlueZ backend on the private bus (BlueZoo's hci0), the board's daemon on
hci1, the page served by `blecontrol web`. A person's session, driven
through the DevTools protocol: click Connect, pick the board in the
chooser (DeviceAccess), drag and key the sliders, flip the switches, type
both LCD lines, clear, stop and restart the outputs, disconnect.

Checked: what the emulated board did (`blecontrol status --json`), every
byte Chromium wrote and its write type (a D-Bus monitor, see monitor.py)
against the page's own log and against docs/protocol.md, the ERROR
notification for a switch the board lacks, coalescing of a slider burst,
no script errors, the board file's names on the labels (as text; only for
the board they belong to: the same page served with no daemon, or with
another board's, keeps the numbers), which origins get Web Bluetooth
(file://, an insecure http:// host, the same host once trusted), and that
a page from another site cannot drive the board through its TCP port (a
fetch POST with frames in its body). Screenshots go to the shots
directory, at phone and desktop widths.

Usage: page_test.py URL SHOTS_DIR MONITOR_FILE WEB_DIR PROFILE_DIR LOG TLS_PORT
Environment: BLECONTROL_BIN, BLECONTROL_SOCKET, DBUS_SYSTEM_BUS_ADDRESS,
BLECONTROL_WEB_URL_NO_DAEMON and BLECONTROL_WEB_URL_OTHER_BOARD (the page from `blecontrol web`
with no daemon, and with the daemon of a board named "other"), CHROMIUM
(default chromium). Prints PASS/FAIL lines; exit status 1 on any
failure. Waits are hang guards only; nothing asserts a duration.
"""
import base64
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
import http.server

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "lib"))
from rig.board import ble_sessions, channel, cli_status  # noqa: E402 - the rigs' one board client
sys.dont_write_bytecode = True  # no __pycache__ in the checkout
from cdp import Chromium, ProtocolError  # noqa: E402

URL, SHOTS, MONITOR, WEB_DIR, PROFILE, LOG, TLS_PORT = sys.argv[1:8]
# The bridge's token, from the address `blecontrol web` printed.
TOKEN = os.environ["BLECONTROL_WEB_TOKEN"]
NAME = "BLEControl-Sim"
PORT = urllib.parse.urlsplit(URL).port
INSECURE = "http://insecure.test:%d/" % PORT
TRUSTED = "http://trusted.test:%d/" % PORT
# The same server behind a TLS proxy with a self-signed certificate.
SELF_SIGNED = "https://board.test:%s/" % TLS_PORT
failures = 0


def check(ok, what, detail=""):
    global failures
    print(("PASS" if ok else "FAIL") + ": " + what + ("" if ok or detail == "" else " (" + str(detail) + ")"), flush=True)
    if not ok:
        failures += 1
    return ok


# ------------------------------------------------------------------ board

def status():
    return cli_status(os.environ["BLECONTROL_BIN"])


# Every wait polls at most this many times, 0.1 s apart (two minutes and
# more): bounded by tries, not a clock, so a busy machine only stretches a
# wait, and only an outcome that never comes fails a check.
TRIES = 1200


def wait_status(predicate, tries=TRIES):
    """The first status for which predicate holds, else None."""
    for _ in range(tries):
        report = status()
        try:
            if predicate(report):
                return report
        except (KeyError, IndexError, TypeError):
            pass
        time.sleep(0.1)
    return None


def near(value, target, step=5.0):
    # PCA9685 counts at 50 Hz are 4.9 µs apart.
    return value is not None and abs(value - target) < step


# ------------------------------------------------------------------- page

class Page:
    def __init__(self, browser, session):
        self.browser = browser
        self.session = session

    def send(self, method, params=None):
        return self.browser.send(method, params, session=self.session)

    def eval(self, expression, gesture=False):
        result = self.send("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True, "userGesture": gesture})
        if "exceptionDetails" in result:
            raise RuntimeError("page script failed: " + json.dumps(result["exceptionDetails"])[:400])
        return result["result"].get("value")

    def wait(self, expression, tries=TRIES):
        """The expression's first true value, else its last value."""
        for _ in range(tries):
            value = self.eval(expression)
            if value:
                return value
            self.browser.pump(0.1)
        return value

    def navigate(self, url):
        """Opens `url` and waits until its page is past 'loading'; raises
        if it does not get there. The old document is marked first: until
        the new one replaces it, a look sees the old one, ready, and a click
        made then goes with it (a chooser that never opened, in one CI run)."""
        def look(expression):
            try:
                return self.eval(expression)
            except ProtocolError as error:
                # The old document's context went while it was asked.
                if "context" not in str(error).lower():
                    raise
                return None
        look("window.blecontrolLeft = true")
        sent = self.send("Page.navigate", {"url": url})
        if sent.get("errorText"):
            raise RuntimeError("navigating to %s: %s" % (url, sent["errorText"]))
        ready = "!window.blecontrolLeft && document.readyState === 'complete' && !!document.body && document.body.dataset.state !== 'loading'"
        for _ in range(TRIES):
            if look(ready):
                return
            self.browser.pump(0.1)
        raise RuntimeError("the page at %s never got past loading (%s)" % (url, look("[location.href, document.readyState, document.body && document.body.dataset.state]")))

    def viewport(self, width, height, mobile):
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})

    def center(self, selector):
        return self.eval("""(() => {
            const element = document.querySelector(%s);
            element.scrollIntoView({block: 'center', inline: 'center'});
            const r = element.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2, r.left, r.width];
        })()""" % json.dumps(selector))

    def mouse(self, kind, x, y, buttons=0, button="none"):
        self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": button, "buttons": buttons, "clickCount": 1 if kind != "mouseMoved" else 0})

    def click(self, selector):
        x, y, _, _ = self.center(selector)
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, 1, "left")
        self.mouse("mouseReleased", x, y, 0, "left")

    def drag_slider(self, selector, fractions):
        """Presses on the thumb and moves along the track: one input event a move."""
        _, y, left, width = self.center(selector)
        points = [left + width * f for f in fractions]
        self.mouse("mouseMoved", points[0], y)
        self.mouse("mousePressed", points[0], y, 1, "left")
        for x in points[1:]:
            self.mouse("mouseMoved", x, y, 1, "left")
        self.mouse("mouseReleased", points[-1], y, 0, "left")

    def key(self, key, code, keycode, text=None):
        down = {"type": "keyDown" if text is None else "keyDown", "key": key, "code": code, "windowsVirtualKeyCode": keycode, "nativeVirtualKeyCode": keycode}
        if text is not None:
            down["text"] = text
        self.send("Input.dispatchKeyEvent", down)
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": key, "code": code, "windowsVirtualKeyCode": keycode, "nativeVirtualKeyCode": keycode})

    def type(self, text):
        self.send("Input.insertText", {"text": text})

    def set_slider(self, element_id, value):
        """Where a drag would end: the value, then the input event a drag fires."""
        self.eval("""(() => { const e = document.getElementById(%s); e.value = %s;
            e.dispatchEvent(new Event('input', {bubbles: true})); })()""" % (json.dumps(element_id), json.dumps(str(value))))

    def screenshot(self, name, full=False):
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": full})
        with open(os.path.join(SHOTS, name), "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        if full:
            # Back to the viewport's own size (capturing beyond it resizes the view).
            self.send("Runtime.evaluate", {"expression": "window.scrollTo(0, 0)"})

    def sent(self):
        """The page's own log of writes: [(hex, type)] in order."""
        return [tuple(x) for x in self.eval("Array.from(document.querySelectorAll('#log li.tx'), (li) => [li.dataset.bytes, li.dataset.type])")]

    def state(self):
        return self.eval("document.body.dataset.state")


# ----------------------------------------------------------------- frames

REQUEST_COMMANDS = {0x00, 0x01, 0x04, 0x05}
COMMAND_COMMANDS = {0x02, 0x03, 0x06}


def frames(data):
    """Splits one write into frames; None if it is not whole frames."""
    result = []
    index = 0
    while index < len(data):
        if index + 2 > len(data) or index + 2 + data[index + 1] > len(data):
            return None
        result.append(data[index:index + 2 + data[index + 1]])
        index += 2 + data[index + 1]
    return result


def monitored():
    writes = []
    with open(MONITOR) as f:
        for line in f:
            writes.append(json.loads(line))
    browser = [(bytes.fromhex(w["bytes"]), w["type"]) for w in writes if w["path"].startswith("/org/bluez/")]
    board = [(bytes.fromhex(w["bytes"]), w["type"]) for w in writes if not w["path"].startswith("/org/bluez/")]
    return browser, board


def as_page(writes):
    return [(" ".join("%02X" % b for b in data), kind) for data, kind in writes]


# ---------------------------------------------------------------- session

def launch():
    arguments = [
        os.environ.get("CHROMIUM", "chromium"), "--headless",
        "--user-data-dir=" + PROFILE, "--no-first-run", "--no-default-browser-check",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-pings",
        "--hide-scrollbars", "--mute-audio",
        # Web Bluetooth is behind this switch on Linux (chrome://flags,
        # "Experimental Web Platform features").
        "--enable-experimental-web-platform-features",
        # Two host names for this machine's loopback server: one a plain
        # insecure origin, one declared trustworthy (what chrome://flags
        # "Insecure origins treated as secure" does on a phone).
        "--host-resolver-rules=MAP insecure.test 127.0.0.1, MAP trusted.test 127.0.0.1, MAP board.test 127.0.0.1",
        "--unsafely-treat-insecure-origin-as-secure=" + TRUSTED.rstrip("/"),
        "--enable-logging=stderr", "--v=0", "--vmodule=device_event_log_impl=1",
    ]
    if os.geteuid() == 0:
        arguments.append("--no-sandbox")  # Chromium refuses root otherwise
    log = open(LOG, "ab")
    browser = Chromium(arguments + ["about:blank"], log=log)
    target = next(t for t in browser.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
    session = browser.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
    page = Page(browser, session)
    for domain in ("Page", "Runtime", "Log", "DeviceAccess"):
        page.send(domain + ".enable")
    return browser, page


def problems(browser, since=0):
    """Script exceptions and error-level console or log entries."""
    found = []
    for event in browser.history[since:]:
        method = event.get("method")
        params = event.get("params", {})
        if method == "Runtime.exceptionThrown":
            found.append(params["exceptionDetails"].get("exception", {}).get("description") or params["exceptionDetails"].get("text"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            found.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            found.append(params["entry"].get("text", "") + " " + params["entry"].get("url", ""))
    return found


# The labels of the outputs the page has, by selector: what they say
# without names, and with the test board's (Tests/Web/run names channels 0
# and 5, switches 0 and 2, and both LCD lines).
LABELS = {
    "label[for=servo0]": ("Channel 0", "Channel 0 · steering"),
    "label[for=servo1]": ("Channel 1", "Channel 1"),
    "label[for=pwm4]": ("Channel 4", "Channel 4"),
    "label[for=pwm5]": ("Channel 5", "Channel 5 · Fan ⚙"),
    "#switch0 + span": ("Switch 0", "Switch 0 · headlights"),
    "#switch1 + span": ("Switch 1", "Switch 1"),
    "#switch2 + span": ("Switch 2", "Switch 2 · <b>horn</b>"),
    "label[for=lcd0]": ("Top line (0)", "Top line (0) · Speed"),
    "label[for=lcd1]": ("Bottom line (1)", "Bottom line (1) · Status"),
}
PLAIN = {selector: texts[0] for selector, texts in LABELS.items()}
NAMED = {selector: texts[1] for selector, texts in LABELS.items()}
LABEL_TEXTS = "Object.fromEntries(%s.map((s) => [s, document.querySelector(s).textContent]))" % json.dumps(list(LABELS))


# What a FAIL of the chooser needs: the page's state and status line, and
# what is under the middle of the Connect button.
CONNECT_HIT = """(() => {
    const r = document.getElementById('connect').getBoundingClientRect();
    const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return {state: document.body.dataset.state, status: document.getElementById('status').textContent,
            button: [r.left, r.top, r.width, r.height], hit: hit ? hit.id || hit.tagName : null, url: location.href};
})()"""


# What the page says when the browser refuses requestDevice for want of a
# user's gesture. The renderer refuses at once when the click's activation
# has lapsed; the browser process, which checks again when the request
# reaches it, refuses later. One CI run on a busy machine got the second
# after a real click: the page was connecting (the renderer had let the
# request through), no chooser came, then Chromium's "Must be handling a
# user gesture". A person would tap again; so does the rig, and says so in
# a note.
GESTURE_REFUSED = "press Connect again"
REFUSED = "document.getElementById('status').textContent.includes(%s)" % json.dumps(GESTURE_REFUSED)
CLICKS = 5


def click_for_chooser(browser, page, predicate):
    """Clicks Connect until a DeviceAccess prompt for which predicate holds
    comes, clicking again (at most CLICKS times) only when the page says
    the browser took the click for no gesture. Returns (the prompt or None,
    the clicks made, what the page showed right after the last click, the
    history index of the last click)."""
    for clicks in range(1, CLICKS + 1):
        since = len(browser.history)
        page.click("#connect")
        # Input.dispatchMouseEvent returns once the page has handled the
        # event, and the click handler sets 'connecting' before it awaits
        # anything: a page still as it was did not get the click.
        where = page.eval(CONNECT_HIT)
        prompt = browser.wait_event(predicate, since, TRIES, give_up=lambda: page.eval(REFUSED))
        if prompt is not None or not page.eval(REFUSED):
            return prompt, clicks, where, since
        print("note: click %d on Connect came too late to count as a gesture (%s); clicking again" % (clicks, where), flush=True)
    return None, CLICKS, where, since


def connect(browser, page):
    """Connect as a person does: a real click (requestDevice needs the
    user's gesture), then the board picked in the chooser (through
    DevTools). The chooser's devices once connected, else None."""
    prompt, clicks, where, since = click_for_chooser(
        browser, page, lambda e: e.get("method") == "DeviceAccess.deviceRequestPrompted" and any(d["name"] == NAME for d in e["params"]["devices"]))
    if not check(prompt is not None, "the chooser lists the board (filter: service FFE0)",
                 {"clicks": clicks,
                  "prompts": [e["params"] for e in browser.history[since:] if e.get("method") == "DeviceAccess.deviceRequestPrompted"],
                  "after the click": where, "now": page.eval(CONNECT_HIT)}):
        return None
    devices = prompt["params"]["devices"]
    page.send("DeviceAccess.selectPrompt", {"id": prompt["params"]["id"], "deviceId": next(d["id"] for d in devices if d["name"] == NAME)})
    state = page.wait("document.body.dataset.state === 'connected'")
    if not check(state, "connected", page.eval("document.getElementById('status').textContent")):
        print("page log:", page.eval("document.getElementById('log').innerText"), file=sys.stderr)
        return None
    return devices


def session(browser, page):
    page.viewport(390, 844, True)
    page.navigate(URL)
    check(page.eval("window.isSecureContext") is True and page.eval("'bluetooth' in navigator"),
          "served from loopback: a secure context with navigator.bluetooth")
    check(page.state() == "disconnected" and page.eval("document.getElementById('servos').disabled") is True,
          "before connecting: state disconnected, controls disabled", page.state())
    check(page.eval("document.getElementById('unsupported').hidden") is True, "no 'unsupported' notice: Chromium finds the (BlueZoo) adapter")
    check(page.eval(LABEL_TEXTS) == PLAIN, "before connecting the labels are the numbers alone", page.eval(LABEL_TEXTS))
    page.screenshot("phone-disconnected.png")
    # A click the browser does not take for the user's (a script's here; on
    # a busy phone, a tap judged too late): the page says what to do, not
    # the browser's words.
    page.eval("document.getElementById('connect').click()")
    said = page.wait(REFUSED)
    check(said and page.state() == "disconnected", "a click the browser does not count as a tap: the page says to press Connect again",
          page.eval(CONNECT_HIT))

    devices = connect(browser, page)
    if devices is None:
        return
    check([d["name"] for d in devices] == [NAME], "the chooser lists only the board", devices)
    check(NAME in page.eval("document.getElementById('status').textContent"), "the status line names the board")
    report = wait_status(lambda r: all(channel(r, c).get("enabled") for c in range(8)) and len(ble_sessions(r)) == 1)
    check(report is not None, "on connect the page enabled channels 0–7 (ANALOG_OUT_EN, as the app does) over one BLE session",
          [(c, channel(status(), c).get("enabled")) for c in range(8)])
    page.wait("document.getElementById('board').textContent !== ''")
    check("simulator" in page.eval("document.getElementById('board').textContent"),
          "Device Information read: the board's model shown", page.eval("document.getElementById('board').textContent"))

    # The board file's names, from blecontrol web's /board.json: after the
    # number, as text (the markup in switch 2's name is shown, not obeyed).
    # (showNames sets every label at once.)
    page.wait("document.querySelector('label[for=servo0]').textContent !== 'Channel 0'")
    check(page.eval(LABEL_TEXTS) == NAMED, "connected: the labels carry the board file's names after the numbers (Channel 0 · steering, Switch 2 · <b>horn</b> as text, Top line (0) · Speed)",
          page.eval(LABEL_TEXTS))
    check(page.eval("document.querySelectorAll('main b, main script').length") == 0, "…set as text: no element made of a name")
    check(page.eval("document.querySelector('label[for=servo0] bdi').textContent") == "steering", "…each name in an isolating <bdi>")
    check("output names from simulator" in page.eval("Array.from(document.querySelectorAll('#log li.info'), (li) => li.textContent).join('|')"),
          "…and the log says where they came from")

    # A burst of 50 slider moves in one go: the first write goes out, every
    # later move folds into one more write with the latest values.
    before = len([s for s in page.sent() if s[0].startswith("02 03")])
    page.eval("""(() => { const e = document.getElementById('servo1');
        for (let v = 0; v <= 490; v += 10) { e.value = String(v); e.dispatchEvent(new Event('input', {bubbles: true})); } })()""")
    wait_status(lambda r: near(channel(r, 1).get("pulse_us"), 1490))
    page.wait("Array.from(document.querySelectorAll('#log li.tx')).some((li) => li.dataset.bytes.startsWith('02 03 00 01 F4 02 03 01 01 EA'))")
    servo_writes = [s for s in page.sent() if s[0].startswith("02 03")][before:]
    check(len(servo_writes) == 2 and " 02 03 01 00 00 " in servo_writes[0][0] + " " and "02 03 01 01 EA" in servo_writes[-1][0],
          "50 slider moves at once → 2 writes: the first value, then the latest (coalesced)", servo_writes)

    # Servo sliders as a person moves them: a drag on channel 0, keys on
    # channel 3, and the demo app's values.
    page.drag_slider("#servo0", [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.3, 0.1])
    dragged = int(page.eval("document.getElementById('servo0').value"))
    check(wait_status(lambda r: near(channel(r, 0).get("pulse_us"), 1000 + dragged)) is not None,
          "a mouse drag on channel 0 ends where the thumb is: %d µs" % (1000 + dragged), channel(status(), 0))
    for element, value in (("servo0", 100), ("servo1", 400), ("servo2", 700)):
        page.set_slider(element, value)
    page.eval("document.getElementById('servo3').focus()")
    page.key("End", "End", 35)
    check(page.eval("document.getElementById('servo3-value').textContent") == "2000 µs", "End key on channel 3: readout 2000 µs")

    # PWM: 0–1000 as the protocol has it (the demo app's negative Int16
    # values are the protocol's business, not a slider's): at 0 the thumb
    # sits at the start of the track, as its readout says 0.0 %.
    check(page.eval("[4, 5, 6, 7].every((c) => document.getElementById('pwm' + c).min === '0')"), "the PWM sliders run from 0 (0.0 % at the track's start)")
    page.set_slider("pwm4", 250)
    page.set_slider("pwm5", 500)
    page.eval("document.getElementById('pwm6').focus()")
    page.key("End", "End", 35)
    page.set_slider("pwm7", 750)
    check(page.eval("document.getElementById('pwm7-value').textContent") == "75.0 %", "PWM 750 reads as 75.0 %",
          page.eval("document.getElementById('pwm7-value').textContent"))

    # Switches by clicking them; this board has no switch 3.
    for index in (0, 2, 3):
        page.click("#switch%d" % index)
    # Its ERROR puts a banner above the cards: once it is there, the layout
    # no longer moves under the next clicks.
    page.wait("!document.getElementById('alert').hidden")

    # Both LCD lines: typed, sent with Enter and with the Show button.
    page.click("#lcd0")
    page.type("BLEControl")
    page.key("Enter", "Enter", 13, "\r")
    page.click("#lcd1")
    page.type("Demo app")
    page.click("#lcd1-form button")

    servos = [100, 400, 700, 1000]

    def demo_outputs(r):
        servo_ok = all(near(channel(r, c).get("pulse_us"), 1000 + servos[c]) for c in range(4))
        duties = [channel(r, c).get("duty") for c in range(4, 8)]
        duty_ok = abs(duties[0] - 0.25) < 0.001 and abs(duties[1] - 0.5) < 0.001 and duties[2] == 1 and abs(duties[3] - 0.75) < 0.001
        switches = [s.get("on") for s in r.get("switches", [])]
        return servo_ok and duty_ok and switches == [True, False, True] and r["lcd"]["lines"] == ["BLEControl      ", "Demo app        "]

    report = wait_status(demo_outputs)
    last = report or status()
    check(report is not None, "the board shows the demo app's session: servos 1100/1400/1700/2000 µs, PWM 25/50/100/100 %, switches on/off/on, both LCD lines",
          [(c, channel(last, c).get("pulse_us"), channel(last, c).get("duty")) for c in range(8)]
          + [[s.get("on") for s in last.get("switches", [])], last["lcd"]["lines"]])

    refused = page.wait("Array.from(document.querySelectorAll('#log li.error'), (li) => li.dataset.bytes + ' ' + li.dataset.refused).join('|')")
    check(refused == "FF 01 06 SWITCH_VAL", "switch 3 (not on this board) → ERROR notification FF 01 06, decoded in the log", refused)
    check("SWITCH_VAL" in page.eval("document.getElementById('alert').hidden ? '' : document.getElementById('alert-text').textContent"),
          "…and shown in the alert banner", page.eval("document.getElementById('alert-text').textContent"))

    page.eval("window.scrollTo(0, 0)")
    page.screenshot("phone-connected.png")
    page.screenshot("phone-connected-full.png", full=True)
    page.send("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    page.screenshot("phone-connected-dark.png")
    page.send("Emulation.setEmulatedMedia", {"features": []})
    page.viewport(1280, 800, False)
    page.screenshot("desktop-connected.png", full=True)
    page.viewport(390, 844, True)

    # UTF-8 text: the length byte counts bytes (+2), not characters.
    page.eval("document.getElementById('lcd0').value = ''")
    page.click("#lcd0")
    page.type("Grüße")
    page.key("Enter", "Enter", 13, "\r")
    page.wait("Array.from(document.querySelectorAll('#log li.tx')).some((li) => li.dataset.bytes.startsWith('04 09 00'))")
    check(any(s == ("04 09 00 47 72 C3 BC C3 9F 65 00", "request") for s in page.sent()),
          "\"Grüße\" goes as 04 09 00 47 72 C3 BC C3 9F 65 00 (7 bytes + 2), with response",
          [s for s in page.sent() if s[0].startswith("04")])
    check(wait_status(lambda r: r["lcd"]["lines"][0].startswith("Gr")) is not None, "the board shows it on the top line", status()["lcd"]["lines"])

    page.click("#clear")
    check(wait_status(lambda r: all(line.strip() == "" for line in r["lcd"]["lines"])) is not None, "Clear display → LCD_CLEAR: both lines blank",
          status()["lcd"]["lines"])

    page.click("#outputs")
    check(wait_status(lambda r: all(not channel(r, c).get("enabled") and channel(r, c).get("pulse_us") == 0 for c in range(8))) is not None,
          "Channels 0–7 running off → every analog output stopped", [(c, channel(status(), c).get("pulse_us")) for c in range(8)])
    page.click("#outputs")
    check(wait_status(lambda r: all(channel(r, c).get("enabled") for c in range(8)) and near(channel(r, 3).get("pulse_us"), 2000)) is not None,
          "…and on again: running with the values kept", [(c, channel(status(), c).get("pulse_us")) for c in range(8)])

    # Disconnect, as the app leaves its screen: every channel stopped first.
    page.click("#connect")
    check(page.wait("document.body.dataset.state === 'disconnected'"), "Disconnect → state disconnected", page.state())
    report = wait_status(lambda r: not ble_sessions(r) and all(not channel(r, c).get("enabled") for c in range(8)))
    check(report is not None, "the board: channels 0–7 stopped and the BLE session gone", ble_sessions(status()))
    failsafe = status()["servo"].get("failsafe")
    check(failsafe is not None and failsafe.startswith("central left: ble"), "the board's failsafe engaged when the page left", failsafe)
    check(page.eval(LABEL_TEXTS) == PLAIN, "disconnected: the labels are the numbers alone again", page.eval(LABEL_TEXTS))
    page.viewport(1280, 800, False)
    page.eval("window.scrollTo(0, 0)")
    page.screenshot("desktop-disconnected.png")

    # Every byte: the page's log, Chromium's WriteValue calls and what
    # reached the board's application are the same writes, in order.
    page_writes = page.sent()
    for _ in range(TRIES):
        browser_writes, board_writes = monitored()
        if len(browser_writes) >= len(page_writes) and len(board_writes) >= len(browser_writes):
            break
        time.sleep(0.1)
    check(as_page(browser_writes) == page_writes, "every write Chromium made is in the page's log, same bytes and write type, in order (%d writes)" % len(page_writes),
          {"page": page_writes[-5:], "chromium": as_page(browser_writes)[-5:], "counts": (len(page_writes), len(browser_writes))})
    check(board_writes == browser_writes, "the board's application received exactly those writes", (len(board_writes), len(browser_writes)))
    bad = []
    for data, kind in browser_writes:
        split = frames(data)
        commands = {f[0] for f in split or []}
        if split is None:
            bad.append(("not whole frames", data.hex()))
        elif commands <= COMMAND_COMMANDS and kind != "command":
            bad.append(("servo/pwm/switch must go without response", data.hex(), kind))
        elif commands <= REQUEST_COMMANDS and kind != "request":
            bad.append(("enable/LCD must go with response", data.hex(), kind))
        elif not (commands <= COMMAND_COMMANDS or commands <= REQUEST_COMMANDS):
            bad.append(("write types mixed in one write", data.hex()))
        elif len(data) > 20 and kind == "command":
            bad.append(("a write without response longer than 20 bytes (the default ATT MTU)", data.hex()))
    check(not bad, "every write is whole frames with the app's write type (without response: SERVO_VAL, PWM_VAL, SWITCH_VAL; with: the rest)", bad)
    enables = [d for d, _ in browser_writes if d[0] == 0x01]
    check(enables[:8] == [bytes([1, 2, c, 1]) for c in range(8)] and enables[-8:] == [bytes([1, 2, c, 0]) for c in range(8)],
          "ANALOG_OUT_EN 0–7 on connect and off before disconnecting, one write each", [e.hex() for e in enables])
    servo = [d for d, _ in browser_writes if d[0] == 0x02]
    check(servo and all(len(d) == 20 and [f[2] for f in frames(d)] == [0, 1, 2, 3] for d in servo),
          "each SERVO_VAL write carries all four servo values (the app resends its kind), 20 bytes")
    check(servo and servo[-1] == bytes.fromhex("02030000640203010190020302 02BC020303 03E8".replace(" ", "")),
          "the last SERVO_VAL write: 100, 400, 700, 1000", servo[-1].hex() if servo else None)
    pwm = [d for d, _ in browser_writes if d[0] == 0x03]
    check(pwm and pwm[-1] == bytes.fromhex("03030400FA030305 01F4030306 03E8030307 02EE".replace(" ", "")),
          "the last PWM_VAL write: 250, 500, 1000, 750", pwm[-1].hex() if pwm else None)
    # A click while an earlier write is in flight rides in the next write.
    switches = [d for d, _ in browser_writes if d[0] == 0x06]
    check([f for d in switches for f in frames(d)] == [bytes([6, 2, 0, 1]), bytes([6, 2, 2, 1]), bytes([6, 2, 3, 1])],
          "SWITCH_VAL: each clicked switch's frame sent once (a click during a write rides in the next)", [s.hex() for s in switches])
    lcd = [d for d, _ in browser_writes if d[0] in (0x04, 0x05)]
    check(lcd[:2] == [bytes([4, 12, 0]) + b"BLEControl" + b"\0", bytes([4, 10, 1]) + b"Demo app" + b"\0"] and lcd[-1] == bytes([5, 0]),
          "LCD_TEXT for both lines (length = bytes + 2, ending 00) and LCD_CLEAR", [d.hex() for d in lcd])


def names_elsewhere(browser, page, url, what, log_says):
    """The page from a server that cannot vouch for this board's names:
    connected, the labels stay numbers, the page raises no alarm (no
    alert, no error, nothing in the console), and its log says `log_says`
    (None: nothing about names)."""
    since = len(browser.history)
    page.viewport(390, 844, True)
    page.navigate(url)
    if connect(browser, page) is None:
        return
    page.wait("document.getElementById('board').textContent !== ''")
    info = "Array.from(document.querySelectorAll('#log li.info'), (li) => li.textContent).join('|')"
    if log_says:
        page.wait("%s.includes(%s)" % (info, json.dumps(log_says)))
    else:
        # The answer to board.json, whatever it was, has come and gone.
        page.wait("performance.getEntriesByType('resource').some((e) => e.name.endsWith('/board.json') && e.responseEnd > 0)")
    check(page.eval(LABEL_TEXTS) == PLAIN, what + ": connected, the labels are the numbers alone", page.eval(LABEL_TEXTS))
    said = page.eval(info)
    check((log_says in said) if log_says else ("names" not in said), what + ": " + ("the log says why: " + log_says if log_says else "the page says nothing about names"), said)
    check(page.eval("document.getElementById('alert').hidden") is True and not problems(browser, since),
          what + ": no alert, no script error, nothing in the console", problems(browser, since))
    page.click("#connect")
    page.wait("document.body.dataset.state === 'disconnected'")
    wait_status(lambda r: not ble_sessions(r))


def chooser_opens(browser, page):
    """Connect opens the chooser (requestDevice passed every security
    check); cancelled, the page says no board was chosen."""
    prompt, _, _, _ = click_for_chooser(browser, page, lambda e: e.get("method") == "DeviceAccess.deviceRequestPrompted")
    if prompt is None:
        return "no chooser: " + str(page.eval("document.getElementById('status').textContent"))
    page.send("DeviceAccess.cancelPrompt", {"id": prompt["params"]["id"]})
    return page.wait("document.getElementById('status').textContent === 'No board chosen'") or page.eval("document.getElementById('status').textContent")


def origins(browser, page):
    """Which origins get Web Bluetooth: what the README tells phone users."""
    page.viewport(390, 844, True)
    page.navigate(INSECURE)
    insecure = page.eval("[window.isSecureContext, 'bluetooth' in navigator, !document.querySelector('[data-reason=secure]').hidden, document.getElementById('connect').disabled]")
    check(insecure == [False, False, True, True], "plain http:// from another host name: no secure context, no navigator.bluetooth; the page says why", insecure)
    page.screenshot("phone-insecure.png")

    page.navigate(TRUSTED)
    trusted = page.eval("[window.isSecureContext, 'bluetooth' in navigator, document.body.dataset.state]")
    check(trusted == [True, True, "disconnected"], "the same page from an origin listed as trustworthy (--unsafely-treat-insecure-origin-as-secure): Web Bluetooth available", trusted)
    opened = chooser_opens(browser, page)
    check(opened is True, "…and Connect opens the chooser there", opened)

    page.send("Page.navigate", {"url": SELF_SIGNED})
    interstitial = page.wait("!!document.getElementById('proceed-link')")
    check(interstitial, "https:// through a proxy with a self-signed certificate: the browser warns first")
    if interstitial:
        # What a person does on the warning: Advanced, then Proceed.
        page.eval("document.getElementById('proceed-link').click()")
        page.wait("location.protocol === 'https:' && !!document.body && !!document.body.dataset.state && document.body.dataset.state !== 'loading'")
        proceeded = page.eval("[location.protocol, window.isSecureContext, 'bluetooth' in navigator, document.body.dataset.state]")
        check(proceeded == ["https:", True, True, "disconnected"], "…past the warning the page is a secure context with Web Bluetooth", proceeded)
        opened = chooser_opens(browser, page)
        check(opened is True, "…and Connect opens the chooser there", opened)

    page.navigate("file://" + os.path.join(os.path.abspath(WEB_DIR), "index.html"))
    local = page.eval("[window.isSecureContext, 'bluetooth' in navigator, document.body.dataset.state]")
    check(local == [True, True, "disconnected"], "the page opened as a local file (file://): its scripts run and Web Bluetooth is available", local)
    opened = chooser_opens(browser, page)
    check(opened is True, "…and Connect opens the chooser there", opened)


class BlankPage(http.server.BaseHTTPRequestHandler):
    """Another site's page, without the control page's Content-Security-
    Policy (which would stop a fetch to another origin itself)."""

    def do_GET(self):  # noqa: N802 - the handler's protocol
        body = b"<!doctype html><title>elsewhere</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *arguments):
        pass


def web_page_on_tcp(page):
    """What a web page can do to the board's TCP transport (docs/protocol.md,
    "TCP"): a cross-site fetch POST whose body holds frames behind NUL
    padding (a decoder that took the headers for frames would be back in
    step after the NULs) is closed at its first bytes: no session, nothing
    decoded. The page is served from loopback, as a page on the local
    network or a local development server is (for a page from the Internet
    Chromium's Local Network Access asks the user first; other browsers do
    not)."""
    before = status()
    port = int(before["transports"]["tcp"].rsplit(":", 1)[1])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), BlankPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page.navigate("http://insecure.test:%d/" % server.server_address[1])
        # ANALOG_OUT_EN 0 on, SERVO_VAL 0 = 1000 (2000 µs), after 300 NULs.
        outcome = page.eval("""(async () => {
            const body = new Uint8Array([...new Array(300).fill(0), 1, 2, 0, 1, 2, 3, 0, 3, 0xE8]);
            const request = fetch('http://127.0.0.1:%d/blecontrol', {method: 'POST', mode: 'no-cors', body})
                .then(() => 'answered', error => 'failed: ' + error.message);
            // A hang guard: a board that kept the connection never settles it.
            const guard = new Promise(resolve => setTimeout(() => resolve('still open after 20 s'), 20000));
            return await Promise.race([request, guard]);
        })()""" % port)
    finally:
        server.shutdown()
    # Chromium gives up on a connection that answers no HTTP either way:
    # this only says the request was made and is over.
    check(str(outcome).startswith("failed"), "a web page's cross-site fetch POST to the TCP port, frames in its body: made, and over (a network error)", outcome)
    after = status()
    changed = [(key, before["counters"][key], after["counters"][key]) for key in ("frames", "sessions_total") if before["counters"][key] != after["counters"][key]]
    check(not changed, "…and the board decoded nothing of it: no session, no frame", changed)


def bridge(browser, page):
    """The page through `blecontrol web`'s bridge, from a host where the
    browser offers no Web Bluetooth (plain http:// from "another machine",
    as an iPhone on the board's Wi-Fi sees it): it connects through the
    server, drives the board (sliders, switches, LCD), shows an ERROR the
    board sent, follows what the CLI did, and closing the page is a
    central leaving: the failsafe acts."""
    page.viewport(390, 844, True)
    page.navigate(INSECURE + "?token=" + TOKEN)
    page.wait("!document.getElementById('connect-bridge').hidden")
    check(page.eval("window.isSecureContext") is False and not page.eval("document.getElementById('connect-bridge').hidden")
          and page.eval("document.getElementById('connect').hidden"),
          "plain http:// from another host: 'Connect through this server' offered, the Bluetooth button gone")
    check(page.eval("location.search") == "", "the token is taken out of the address bar", page.eval("location.href"))
    check(not page.eval("document.querySelector('[data-bridge=available]').hidden"), "the notice says the page can drive the board through the server")
    page.screenshot("phone-bridge-disconnected.png")
    page.click("#connect-bridge")
    if not check(page.wait("document.body.dataset.state === 'connected'"), "connected through the server",
                 page.eval("document.getElementById('status').textContent")):
        print("page log:", page.eval("document.getElementById('log').innerText"), file=sys.stderr)
        return
    web = lambda r: [s for s in r.get("sessions", []) if s.get("transport") == "web"]  # noqa: E731
    report = wait_status(lambda r: len(web(r)) == 1 and all(channel(r, c).get("enabled") for c in range(8)))
    check(report is not None, "the board has one web session (a central), and channels 0–7 enabled by the page", status().get("sessions"))
    page.wait("document.getElementById('board').textContent === 'simulator'")
    check(page.eval("document.getElementById('board').textContent") == "simulator", "the page names the board (from the bridge's state)")
    page.wait("document.querySelector('label[for=servo0]').textContent !== 'Channel 0'")
    check(page.eval(LABEL_TEXTS) == NAMED, "…and labels the outputs with its board file's names", page.eval(LABEL_TEXTS))

    page.set_slider("servo0", 200)
    page.set_slider("pwm4", 300)
    page.click("#switch1")
    page.click("#lcd0")
    page.eval("document.getElementById('lcd0').value = ''")
    page.type("Bridge")
    page.key("Enter", "Enter", 13, "\r")
    driven = wait_status(lambda r: near(channel(r, 0).get("pulse_us"), 1200) and abs(channel(r, 4).get("duty") - 0.3) < 0.001
                         and r["switches"][1]["on"] and r["lcd"]["lines"][0].startswith("Bridge"))
    last = status()
    check(driven is not None, "through the bridge: servo 0 at 1200 µs, PWM 4 at 30 %, switch 1 on, the LCD shows Bridge",
          (channel(last, 0).get("pulse_us"), channel(last, 4).get("duty"), last["switches"], last["lcd"]["lines"]))
    # This board has no switch 3: its ERROR comes back through the bridge.
    page.click("#switch3")
    check(page.wait("!document.getElementById('alert').hidden && document.querySelector('#log li.rx.error') !== null"),
          "switch 3 (not on this board): the board's ERROR reaches the page, shown and logged")
    page.click("#alert-dismiss")

    # What someone else does shows on the page.
    cli = os.environ["BLECONTROL_BIN"]
    import subprocess
    subprocess.run([cli, "servo", "1", "800"], check=False, capture_output=True)
    subprocess.run([cli, "switch", "0", "on"], check=False, capture_output=True)
    followed = page.wait("document.getElementById('servo1').value === '800' && document.getElementById('switch0').checked")
    check(followed, "the page follows what the CLI did: servo 1 slider at 800, switch 0 on",
          page.eval("[document.getElementById('servo1').value, document.getElementById('switch0').checked]"))
    # A timed move (long, so that the page's state poll sees it under way
    # however busy the machine): the thumb follows the servo's position,
    # the readout says where it is going; a plain command then ends it.
    subprocess.run([cli, "servo", "2", "100"], check=False, capture_output=True)
    page.wait("document.getElementById('servo2').value === '100'")
    subprocess.run([cli, "servo", "2", "900", "--over", "60s"], check=False, capture_output=True)
    under_way = page.wait("(() => { const v = Number(document.getElementById('servo2').value);"
                          " return document.getElementById('servo2-value').textContent.endsWith('→ 1900 µs') && v > 100 && v < 900; })()")
    check(under_way, "a timed move (CLI --over 60s): the slider's thumb follows the servo on its way, the readout says where it goes",
          page.eval("[document.getElementById('servo2').value, document.getElementById('servo2-value').textContent]"))
    page.screenshot("phone-bridge-connected.png")
    subprocess.run([cli, "servo", "2", "900"], check=False, capture_output=True)
    check(page.wait("document.getElementById('servo2').value === '900' && document.getElementById('servo2-value').textContent === '1900 µs'"),
          "…and once it is there, the thumb and the readout rest at 1900 µs",
          page.eval("[document.getElementById('servo2').value, document.getElementById('servo2-value').textContent]"))

    # Leaving the page: the central leaves, the failsafe acts.
    page.navigate("about:blank")
    report = wait_status(lambda r: (r.get("servo") or {}).get("failsafe", "") and "central left: web" in r["servo"]["failsafe"] and not web(r))
    check(report is not None, "the page closed: its web session ends and the failsafe engages (central left: web …)",
          (status().get("servo") or {}).get("failsafe"))


def bridge_refusals():
    """What the bridge refuses, and what a hostile client costs: no token,
    a wrong one, a page of another origin, frames that break RFC 6455, a
    message over the limit, text, a flood of writes; and the daemon keeps
    serving the next page."""
    from bridge_client import Bridge, Refused
    port = PORT

    def refused(what, **options):
        try:
            Bridge(port, **options).close()
        except Refused as refusal:
            return refusal
        return None

    no_token = refused("no token", token=None)
    check(no_token is not None and no_token.status == 401, "the bridge without the token: 401", no_token)
    wrong = refused("wrong token", token="0" * len(TOKEN))
    check(wrong is not None and wrong.status == 401, "the bridge with a wrong token: 401", wrong)
    foreign = refused("foreign origin", token=TOKEN, origin="http://evil.test")
    check(foreign is not None and foreign.status == 403, "a page of another origin, with the token: 403", foreign)
    plain = None
    try:
        import urllib.request
        urllib.request.urlopen("http://127.0.0.1:%d/bridge?token=%s" % (port, TOKEN), timeout=20)
    except urllib.error.HTTPError as error:
        plain = error.code
    check(plain == 426, "a plain GET of the bridge: 426 Upgrade Required", plain)

    def closed_with(send):
        client = Bridge(port, token=TOKEN)
        client.state()
        send(client)
        for _ in range(200):
            try:
                kind, value = client.receive()
            except (EOFError, OSError):
                return "eof"
            if kind == "close":
                client.sock.close()
                return value
        return None

    check(closed_with(lambda c: c.send_frame(0x2, b"\x02\x03\x00\x01\xf4", masked=False)) == 1002, "an unmasked frame: closed with 1002")
    check(closed_with(lambda c: c.send_frame(0x2, bytes(20000))) == 1009, "a 20000-byte message: closed with 1009 (unread)")
    check(closed_with(lambda c: c.send_frame(0x1, b"{}")) == 1003, "a text message: closed with 1003")

    def flood(client):
        # In one send, so the bridge has them all when it closes: closing
        # with some still unread would reset the connection, close frame
        # and all.
        client.sock.sendall(b"".join(Bridge.frame(0x2, bytes.fromhex("0203000100")) for _ in range(20)))
    check(closed_with(flood) == 1008, "20 writes without waiting for answers (16 may wait): closed with 1008")
    client = Bridge(port, token=TOKEN)
    replies, answer = client.write(bytes.fromhex("02050101"))
    client.close()
    check(answer == {"applied": True} and replies == b"", "after all that, a page's write is applied (ANALOG_OUT_EN 1 on)", (replies, answer))


def main():
    try:
        browser, page = launch()
    except Exception as error:  # noqa: BLE001 - a browser that does not start is a failure, not a traceback
        check(False, "Chromium starts with the DevTools pipe", repr(error))
        return 1

    def stopped(number, frame):
        # The run script's hang guard: take the browser down with us.
        browser.process.kill()
        sys.exit(1)

    signal.signal(signal.SIGTERM, stopped)
    try:
        session(browser, page)
        browser.pump()
        found = problems(browser)
        check(not found, "no script errors, failed loads or CSP violations while the page ran", found)
        names_elsewhere(browser, page, os.environ["BLECONTROL_WEB_URL_NO_DAEMON"], "served with no daemon to ask", None)
        names_elsewhere(browser, page, os.environ["BLECONTROL_WEB_URL_OTHER_BOARD"], "served with another board's daemon",
                        "the names of other (the board where this page came from) are not shown: this board is simulator")
        origins(browser, page)
        web_page_on_tcp(page)
        bridge(browser, page)
        bridge_refusals()
    except Exception as error:  # noqa: BLE001
        check(False, "the browser session ran to the end", repr(error))
        browser.pump()
        print("page log:", file=sys.stderr)
        try:
            print(page.eval("document.getElementById('log').innerText"), file=sys.stderr)
        except Exception:  # noqa: BLE001
            pass
    finally:
        browser.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

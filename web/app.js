// The control page: the original demo app's screen (4 servo sliders, 4 PWM
// sliders, 4 switches, 2 LCD lines) over Web Bluetooth, or through the
// server's bridge (a WebSocket to the board's daemon) where Bluetooth is not
// there, with the app's write types and a log of every byte sent and every
// ERROR received.
(function () {
  'use strict';

  const P = window.BLEControlProtocol;
  const SERVICE = 0xFFE0;
  const CHARACTERISTIC = 0xFFE1;
  const SERVO_CHANNELS = [0, 1, 2, 3];
  const PWM_CHANNELS = [4, 5, 6, 7];
  const ANALOG_CHANNELS = SERVO_CHANNELS.concat(PWM_CHANNELS);
  const SWITCHES = [0, 1, 2, 3];
  const LOG_LIMIT = 300;

  const $ = (id) => document.getElementById(id);

  // What the controls show; writes are built from this when their turn
  // comes, so a write always carries the latest values.
  const state = {
    servo: SERVO_CHANNELS.map(() => 500),
    pwm: PWM_CHANNELS.map(() => 0),
    switches: SWITCHES.map(() => false),
    dirtySwitches: new Set(),
    lcd: ['', ''],
  };

  let device = null;
  // The bridge's WebSocket while connected through the server.
  let socket = null;
  // The token the bridge asks for: from the address blecontrol web printed,
  // kept for this tab only and taken out of the address bar.
  const token = (() => {
    const given = new URLSearchParams(location.search).get('token');
    try {
      if (given) {
        sessionStorage.setItem('blecontrol-token', given);
        history.replaceState(null, '', location.pathname);
      }
      return given || sessionStorage.getItem('blecontrol-token');
    } catch (error) {
      return given;
    }
  })();
  const bridgeAvailable = (location.protocol === 'http:' || location.protocol === 'https:') && !!token;
  let leaving = false;
  // Counts connections and disconnections: an answer that arrives after
  // either belongs to a connection that is gone.
  let generation = 0;
  const decoder = new P.ReplyDecoder();

  // ---------------------------------------------------------------- log

  const logList = $('log');

  function clock() {
    const now = new Date();
    const two = (n) => String(n).padStart(2, '0');
    return two(now.getHours()) + ':' + two(now.getMinutes()) + ':' + two(now.getSeconds()) + '.' + String(now.getMilliseconds()).padStart(3, '0');
  }

  /** One log line: kind is tx (bytes sent), rx (bytes received), error or info. */
  function log(kind, text, bytes, attributes) {
    const item = document.createElement('li');
    item.className = kind;
    const time = document.createElement('time');
    time.textContent = clock();
    item.append(time);
    if (bytes) {
      const code = document.createElement('code');
      code.textContent = (kind === 'tx' ? '→ ' : '← ') + P.hex(bytes);
      item.append(' ', code);
      item.dataset.bytes = P.hex(bytes);
    }
    const what = document.createElement('span');
    what.textContent = text;
    item.append(' ', what);
    Object.assign(item.dataset, attributes || {});
    // Newest last, as a terminal would; keep the view pinned to the end
    // unless the reader scrolled back.
    const pinned = logList.scrollTop + logList.clientHeight >= logList.scrollHeight - 8;
    logList.append(item);
    while (logList.childElementCount > LOG_LIMIT) logList.firstElementChild.remove();
    if (pinned) logList.scrollTop = logList.scrollHeight;
  }

  /**
   * Says something to the status line (announced to screen readers); a
   * board's name, if given, is kept on one line.
   */
  function announce(text, name) {
    const status = $('status');
    status.textContent = text;
    if (name) {
      const span = document.createElement('span');
      span.className = 'name';
      span.textContent = name;
      status.append(span);
    }
  }

  /** Shows what the board refused until dismissed (announced at once). */
  function alertUser(text) {
    $('alert-text').textContent = text;
    $('alert').hidden = false;
  }

  $('alert-dismiss').addEventListener('click', () => {
    $('alert').hidden = true;
  });

  // -------------------------------------------------------------- writes

  /**
   * Every write goes through one queue, one at a time: Android and other
   * platforms refuse a second GATT operation while one is in progress. A
   * coalescing entry (a slider kind, a switch set, an LCD line) is queued at
   * most once and builds its bytes only when its turn comes: a slider dragged
   * while its previous write is in flight sends one more write with the
   * latest values, not one per movement.
   */
  class Writer {
    constructor() {
      // { write(data, response) → Promise, withoutResponse }: FFE1, or the bridge.
      this.link = null;
      this.queue = [];
      this.busy = false;
      // A board with ble.acknowledged_writes offers no write without
      // response; everything then goes with response.
      this.withoutResponse = true;
    }

    attach(link) {
      this.link = link;
      this.withoutResponse = link.withoutResponse;
      this.queue = [];
    }

    detach() {
      this.link = null;
      for (const entry of this.queue) entry.reject(new Error('disconnected'));
      this.queue = [];
    }

    /** Queues `build` under `key` unless that key is already waiting. */
    coalesce(key, build, response) {
      if (!this.link || this.queue.some((entry) => entry.key === key)) return;
      this.push({ key, build, response }).catch(() => {});
    }

    /** Queues one write of its own; resolves once it is written. */
    send(bytes, response, note) {
      if (!this.link) return Promise.reject(new Error('not connected'));
      return this.push({ key: null, build: () => ({ bytes, note }), response });
    }

    push(entry) {
      return new Promise((resolve, reject) => {
        entry.resolve = resolve;
        entry.reject = reject;
        this.queue.push(entry);
        this.pump();
      });
    }

    async pump() {
      if (this.busy) return;
      this.busy = true;
      try {
        while (this.queue.length && this.link) {
          const entry = this.queue.shift();
          const built = entry.build();
          if (!built || !built.bytes.length) {
            entry.resolve();
            continue;
          }
          const response = entry.response || !this.withoutResponse;
          const data = new Uint8Array(built.bytes);
          log('tx', built.note + (response ? ' · with response' : ' · without response'), built.bytes, { type: response ? 'request' : 'command' });
          try {
            await this.link.write(data, response);
            entry.resolve();
          } catch (error) {
            log('error', 'write failed: ' + error.message);
            entry.reject(error);
          }
        }
      } finally {
        this.busy = false;
      }
    }
  }

  const writer = new Writer();

  // The demo app sends every value of a kind again whenever one changes;
  // four frames of 5 bytes are 20, exactly one write at the default ATT MTU.
  function requestServos() {
    writer.coalesce('servo', () => ({
      bytes: SERVO_CHANNELS.flatMap((channel, i) => P.servo(channel, state.servo[i])),
      note: 'SERVO_VAL 0–3 = ' + state.servo.join(', '),
    }), false);
  }

  function requestPWM() {
    writer.coalesce('pwm', () => ({
      bytes: PWM_CHANNELS.flatMap((channel, i) => P.pwm(channel, state.pwm[i])),
      note: 'PWM_VAL 4–7 = ' + state.pwm.join(', '),
    }), false);
  }

  function requestSwitches() {
    writer.coalesce('switch', () => {
      const changed = Array.from(state.dirtySwitches).sort((a, b) => a - b);
      state.dirtySwitches.clear();
      return {
        bytes: changed.flatMap((index) => P.switchValue(index, state.switches[index])),
        note: changed.map((index) => 'SWITCH_VAL ' + index + ' ' + (state.switches[index] ? 'on' : 'off')).join(', '),
      };
    }, false);
  }

  function requestLine(line) {
    writer.coalesce('lcd' + line, () => ({
      bytes: P.lcdText(line, state.lcd[line]),
      note: 'LCD_TEXT line ' + line + ' "' + P.displayText(state.lcd[line]) + '"',
    }), true);
  }

  /** ANALOG_OUT_EN for channels 0–7, one write with response each, as the app does. */
  function setOutputs(on) {
    return Promise.all(ANALOG_CHANNELS.map((channel) =>
      writer.send(P.enable(channel, on), true, 'ANALOG_OUT_EN ' + channel + ' ' + (on ? 'on' : 'off'))));
  }

  // ---------------------------------------------------------- controls

  function servoText(value) {
    return (1000 + value) + ' µs';
  }

  function pwmText(value) {
    if (value >= 0) return (value / 10).toFixed(1) + ' %';
    // The app's Int16: the board reads a negative value as above 1000.
    return value + ' → ' + (value & 0xFFFF) + ': 100 %';
  }

  function bindSliders(kind, channels, values, text, request) {
    channels.forEach((channel, i) => {
      const input = $(kind + channel);
      const output = $(kind + channel + '-value');
      const show = () => {
        output.textContent = text(values[i]);
        input.setAttribute('aria-valuetext', text(values[i]));
      };
      input.value = String(values[i]);
      show();
      input.addEventListener('input', () => {
        touch(kind + channel);
        values[i] = Number(input.value);
        show();
        request();
      });
    });
  }

  bindSliders('servo', SERVO_CHANNELS, state.servo, servoText, requestServos);
  bindSliders('pwm', PWM_CHANNELS, state.pwm, pwmText, requestPWM);

  SWITCHES.forEach((index) => {
    const input = $('switch' + index);
    input.checked = state.switches[index];
    input.addEventListener('change', () => {
      touch('switch' + index);
      state.switches[index] = input.checked;
      state.dirtySwitches.add(index);
      requestSwitches();
    });
  });

  [0, 1].forEach((line) => {
    $('lcd' + line + '-form').addEventListener('submit', (event) => {
      event.preventDefault();
      touch('lcd' + line);
      state.lcd[line] = $('lcd' + line).value;
      requestLine(line);
    });
  });

  $('clear').addEventListener('click', () => {
    writer.send(P.lcdClear(), true, 'LCD_CLEAR').catch(() => {});
  });

  $('outputs').addEventListener('change', (event) => {
    touch('outputs');
    setOutputs(event.target.checked).catch(() => {});
  });

  $('clear-log').addEventListener('click', () => {
    logList.replaceChildren();
  });

  // --------------------------------------------------------------- names

  // What the board file calls its outputs ("Channel 0 · steering"), from
  // the daemon of the machine that served this page (board.json). The
  // numbers stay: the protocol speaks in them.
  const labels = [].concat(
    SERVO_CHANNELS.map((channel) => ['channel', channel, document.querySelector('label[for="servo' + channel + '"]')]),
    PWM_CHANNELS.map((channel) => ['channel', channel, document.querySelector('label[for="pwm' + channel + '"]')]),
    SWITCHES.map((index) => ['switch', index, $('switch' + index).nextElementSibling]),
    [0, 1].map((line) => ['line', line, document.querySelector('label[for="lcd' + line + '"]')]));

  /** Puts each output's name after its number, or takes them all away (null). */
  function showNames(names) {
    for (const [kind, number, label] of labels) {
      const name = names ? names[kind].get(number) : undefined;
      let slot = label.querySelector('.output-name');
      if (!name) {
        if (slot) slot.remove();
        continue;
      }
      if (!slot) {
        slot = document.createElement('span');
        slot.className = 'output-name';
        label.append(slot);
      }
      // Text only, and isolated: a name in another script cannot reorder the label.
      const text = document.createElement('bdi');
      text.textContent = name;
      slot.replaceChildren(' · ', text);
    }
  }

  /** Number → name for one kind, from board.json's list of them. */
  function namesOf(list, key) {
    const names = new Map();
    if (!Array.isArray(list)) return names;
    for (const entry of list.slice(0, 256)) {
      if (entry && Number.isInteger(entry[key]) && typeof entry.name === 'string' && entry.name.length <= 160 && !names.has(entry[key])) {
        names.set(entry[key], entry.name);
      }
    }
    return names;
  }

  /**
   * Shows the names board.json gives, if the board just connected to is the
   * one they belong to: its Device Information model is the board's name.
   * A page opened from a file, or served with no daemon to ask, keeps the
   * numbers alone and says nothing.
   */
  async function loadNames(asked, model) {
    if (location.protocol !== 'http:' && location.protocol !== 'https:') return;
    let data = null;
    try {
      const response = await fetch('board.json', { cache: 'no-store' });
      if (response.ok) data = await response.json();
    } catch (error) {
      return;
    }
    if (asked !== generation) return;
    if (!data || typeof data.board !== 'string') return;
    if (data.board !== model) {
      log('info', 'the names of ' + data.board + ' (the board where this page came from) are not shown: this board is ' + (model || 'not saying its name'));
      return;
    }
    const names = { channel: namesOf(data.channels, 'channel'), switch: namesOf(data.switches, 'switch'), line: namesOf(data.lcd_lines, 'line') };
    showNames(names);
    if (names.channel.size + names.switch.size + names.line.size) log('info', 'output names from ' + data.board + '’s board file');
  }

  // ---------------------------------------------------------- connection

  const connectButton = $('connect');
  const bridgeButton = $('connect-bridge');
  // 'bluetooth' or 'bridge': the way the page is (or was last) connected.
  let via = null;
  // Whether Web Bluetooth can be used here (checkSupport says).
  let bluetoothWorks = false;
  // Whether the notice on Bluetooth's absence is up (checkSupport).
  let noticeShown = false;

  function setState(name, text, boardName) {
    document.body.dataset.state = name;
    const connected = name === 'connected';
    const busy = connected || name === 'connecting';
    for (const fieldset of document.querySelectorAll('fieldset.needs-board')) fieldset.disabled = !connected;
    // While connected one way, the other way's button goes.
    connectButton.hidden = (busy && via === 'bridge') || (!bluetoothWorks && bridgeAvailable);
    bridgeButton.hidden = !bridgeAvailable || (busy && via === 'bluetooth');
    const label = (button, idle) => {
      button.textContent = connected ? 'Disconnect' : name === 'connecting' ? 'Connecting…' : idle;
    };
    label(connectButton, 'Connect over Bluetooth');
    label(bridgeButton, 'Connect through this server');
    // Why Bluetooth is not there matters less once the page works without it.
    if (noticeShown) $('unsupported').hidden = connected && via === 'bridge';
    connectButton.disabled = name === 'connecting' || !bluetoothWorks;
    bridgeButton.disabled = name === 'connecting';
    if (text) announce(text, boardName);
  }

  function onNotification(event) {
    const view = event.target.value;
    received(Array.from(new Uint8Array(view.buffer, view.byteOffset, view.byteLength)));
  }

  /** Bytes the board sent: a notification, or a bridge message. */
  function received(bytes) {
    for (const frame of decoder.push(bytes)) {
      const text = P.describeReply(frame);
      const isError = frame.command === P.Command.ERROR;
      log(isError ? 'rx error' : 'rx', text, frame.bytes, isError ? { refused: P.commandName(frame.data[0]) } : {});
      if (isError) alertUser(text);
    }
  }

  /** Lets go of the link: the writer's queue and, through the server, the bridge's socket and its pending writes. */
  function dropLink() {
    writer.detach();
    if (!socket) return;
    const closing = socket;
    socket = null;
    closing.onclose = null;
    closing.close();
    for (const pending of answers.splice(0)) pending.reject(new Error('disconnected'));
  }

  function onDisconnected() {
    dropLink();
    $('alert').hidden = true;
    $('board').textContent = '';
    showNames(null);
    generation += 1;
    decoder.reset();
    log('info', leaving ? 'disconnected' : 'the board went away');
    setState('disconnected', leaving ? 'Not connected' : 'Connection lost: ' + (via === 'bridge' ? 'the server' : device ? device.name : 'the board') + ' went away');
    leaving = false;
  }

  /** The board's name (its model), '' if it does not say. */
  async function readDeviceInformation(server) {
    // The board names itself here (model = the board's name, firmware
    // revision); optional: only the output names depend on it.
    try {
      const service = await server.getPrimaryService('device_information');
      const decode = async (uuid) => new TextDecoder().decode(await (await service.getCharacteristic(uuid)).readValue());
      const model = await decode('model_number_string');
      const firmware = await decode('firmware_revision_string').catch(() => '');
      $('board').textContent = model + (firmware ? ' · firmware ' + firmware : '');
      return model;
    } catch (error) {
      $('board').textContent = '';
      return '';
    }
  }

  /** requestDevice refused for want of a user's gesture: the renderer
   * says so at once when the tap's activation has lapsed, the browser
   * process later when its own check of it finds it lapsed. */
  function refusedGesture(error) {
    return error.message.includes('user gesture');
  }

  async function connect() {
    via = 'bluetooth';
    setState('connecting', 'Choose the board in the browser’s list…');
    let chosen;
    try {
      chosen = await navigator.bluetooth.requestDevice({
        filters: [{ services: [SERVICE] }],
        optionalServices: [SERVICE, 'device_information'],
      });
    } catch (error) {
      setState('disconnected', error.name === 'NotFoundError' ? 'No board chosen'
        : refusedGesture(error) ? 'The browser did not take that as a tap (a busy phone can be late): press Connect again'
        : 'Cannot scan: ' + error.message);
      return;
    }
    if (device && device !== chosen) device.removeEventListener('gattserverdisconnected', onDisconnected);
    device = chosen;
    device.removeEventListener('gattserverdisconnected', onDisconnected);
    device.addEventListener('gattserverdisconnected', onDisconnected);
    const name = device.name || 'the board';
    setState('connecting', 'Connecting to ' + name + '…');
    try {
      const server = await device.gatt.connect();
      const service = await server.getPrimaryService(SERVICE);
      const characteristic = await service.getCharacteristic(CHARACTERISTIC);
      decoder.reset();
      if (characteristic.properties.notify) {
        characteristic.removeEventListener('characteristicvaluechanged', onNotification);
        characteristic.addEventListener('characteristicvaluechanged', onNotification);
        await characteristic.startNotifications();
      }
      writer.attach({
        withoutResponse: characteristic.properties.writeWithoutResponse,
        write: (data, response) => response ? characteristic.writeValueWithResponse(data) : characteristic.writeValueWithoutResponse(data),
      });
      log('info', 'connected to ' + name);
      if (!writer.withoutResponse) {
        log('info', 'this board acknowledges every write (ble.acknowledged_writes): servo, PWM and switch values go with response');
      }
      // The app starts every analog output when its control screen opens.
      await setOutputs(true);
      $('outputs').checked = true;
      setState('connected', 'Connected to ', name);
      generation += 1;
      const asked = generation;
      readDeviceInformation(server).then((model) => loadNames(asked, model));
    } catch (error) {
      log('error', 'connecting failed: ' + error.message);
      writer.detach();
      // Quietly: this failure, not "connection lost", is the news.
      device.removeEventListener('gattserverdisconnected', onDisconnected);
      if (device.gatt.connected) device.gatt.disconnect();
      setState('disconnected', 'Could not connect to ' + name + ': ' + error.message);
    }
  }

  async function disconnect() {
    leaving = true;
    setState('connecting', 'Stopping the outputs…');
    // As the app does when its control screen closes: every channel stopped
    // before the link goes.
    try {
      await setOutputs(false);
      $('outputs').checked = false;
    } catch (error) {
      // Disconnect anyway; the board's failsafe covers the outputs.
    }
    if (via === 'bluetooth' && device && device.gatt.connected) device.gatt.disconnect();
    else onDisconnected();
  }

  connectButton.addEventListener('click', () => {
    if (document.body.dataset.state === 'connected') disconnect();
    else connect();
  });

  bridgeButton.addEventListener('click', () => {
    if (document.body.dataset.state === 'connected') disconnect();
    else connectBridge();
  });

  // ------------------------------------------------------------- bridge

  // Resolvers of the writes sent through the bridge, in order: each is
  // answered by {"applied": …} once the board has applied it.
  const answers = [];
  // When each control was last moved here: the board's state does not
  // move it back for a moment (the write may still be on its way).
  const touched = new Map();
  const HOLD_MS = 1500;

  function touch(key) {
    touched.set(key, Date.now());
  }

  function held(key) {
    return Date.now() - (touched.get(key) || 0) < HOLD_MS;
  }

  /**
   * Connects through the server: a WebSocket to its bridge, which opens the
   * board's daemon as a central. The board sees one more central; closing
   * the tab is that central leaving.
   */
  function connectBridge() {
    via = 'bridge';
    setState('connecting', 'Connecting through ' + location.host + '…');
    const url = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/bridge?token=' + encodeURIComponent(token);
    const opened = new WebSocket(url);
    opened.binaryType = 'arraybuffer';
    socket = opened;
    let ready = false;
    opened.onopen = async () => {
      decoder.reset();
      writer.attach({
        // The bridge applies each write before answering, like a write
        // with response; the board's replies arrive as binary messages.
        withoutResponse: true,
        write: (data) => new Promise((resolve, reject) => {
          if (opened.readyState !== WebSocket.OPEN) return reject(new Error('not connected'));
          answers.push({ resolve, reject });
          opened.send(data);
        }),
      });
      log('info', 'connected through ' + location.host);
      try {
        await setOutputs(true);
        $('outputs').checked = true;
        ready = true;
        generation += 1;
        setState('connected', 'Connected through ' + location.host + ' to ', $('board').textContent || 'the board');
      } catch (error) {
        log('error', 'starting the outputs failed: ' + error.message);
      }
    };
    opened.onmessage = (event) => {
      if (event.data instanceof ArrayBuffer) return received(Array.from(new Uint8Array(event.data)));
      let message;
      try {
        message = JSON.parse(event.data);
      } catch (error) {
        return;
      }
      if (message && typeof message.applied === 'boolean') {
        const pending = answers.shift();
        if (pending) pending.resolve();
      } else if (message && message.state) {
        showState(message.state);
      }
    };
    opened.onclose = (event) => {
      if (socket !== opened) return;
      if (!ready && !leaving) {
        dropLink();
        log('error', 'the bridge refused or closed' + (event.reason ? ': ' + event.reason : '') + ' (code ' + event.code + ')');
        setState('disconnected', 'Could not connect through ' + location.host + (event.code === 1006 ? ': refused (is the token right? is blecontrold running?)' : ''));
        return;
      }
      onDisconnected();
    };
  }

  /** Puts the board's state (whoever set it) on the controls not just moved here. */
  function showState(board) {
    if (typeof board.board === 'string' && $('board').textContent !== board.board) {
      $('board').textContent = board.board;
      if (document.body.dataset.state === 'connected') announce('Connected through ' + location.host + ' to ', board.board);
      const asked = generation;
      loadNames(asked, board.board);
    }
    const channels = new Map((Array.isArray(board.channels) ? board.channels : []).map((entry) => [entry.channel, entry]));
    const follow = (kind, list, values, text, command) => list.forEach((channel, i) => {
      const entry = channels.get(channel);
      if (!entry || entry.command !== command || !Number.isInteger(entry.value) || held(kind + channel)) return;
      const value = Math.max(0, Math.min(1000, entry.value));
      // A channel with motion limits on its way: the thumb shows where it
      // has got to, the readout where it is going.
      const moving = entry.moving === true && Number.isInteger(entry.position);
      const shown = moving ? Math.max(0, Math.min(1000, entry.position)) : value;
      const input = $(kind + channel);
      values[i] = value;
      input.value = String(shown);
      const readout = moving ? text(shown) + ' → ' + text(value) : text(value);
      $(kind + channel + '-value').textContent = readout;
      input.setAttribute('aria-valuetext', readout);
    });
    follow('servo', SERVO_CHANNELS, state.servo, servoText, 'servo');
    follow('pwm', PWM_CHANNELS, state.pwm, pwmText, 'pwm');
    if (!held('outputs')) {
      const analog = ANALOG_CHANNELS.map((channel) => channels.get(channel)).filter(Boolean);
      if (analog.length) $('outputs').checked = analog.every((entry) => entry.enabled);
    }
    for (const entry of Array.isArray(board.switches) ? board.switches : []) {
      const index = SWITCHES.indexOf(entry.switch);
      if (index < 0 || held('switch' + index) || state.dirtySwitches.has(index)) continue;
      state.switches[index] = !!entry.on;
      $('switch' + index).checked = !!entry.on;
    }
    (Array.isArray(board.lcd) ? board.lcd : []).slice(0, 2).forEach((text, line) => {
      const input = $('lcd' + line);
      if (typeof text !== 'string' || document.activeElement === input || held('lcd' + line)) return;
      input.value = text.replace(/\s+$/, '');
      state.lcd[line] = input.value;
    });
    const failsafe = typeof board.failsafe === 'string' ? board.failsafe : '';
    if (failsafe !== shownFailsafe) {
      shownFailsafe = failsafe;
      if (failsafe) log('error', 'FAILSAFE: ' + failsafe);
      else log('info', 'the failsafe ended');
    }
    $('failsafe').hidden = !failsafe;
    $('failsafe').textContent = failsafe ? 'Failsafe: ' + failsafe + '. A command ends it.' : '';
  }

  let shownFailsafe = '';

  // ---------------------------------------------------------- support

  async function checkSupport() {
    const notice = $('unsupported');
    let reason = null;
    if (!window.isSecureContext) {
      reason = 'secure';
    } else if (!navigator.bluetooth) {
      reason = 'api';
    } else {
      try {
        if (!(await navigator.bluetooth.getAvailability())) reason = 'adapter';
      } catch (error) {
        reason = 'adapter';
      }
    }
    bluetoothWorks = !reason;
    if (!reason) {
      setState('disconnected', 'Not connected');
      return;
    }
    for (const part of notice.querySelectorAll('[data-reason]')) part.hidden = part.dataset.reason !== reason;
    const servedHere = location.protocol === 'http:' || location.protocol === 'https:';
    notice.querySelector('[data-bridge="available"]').hidden = !bridgeAvailable;
    notice.querySelector('[data-bridge="token"]').hidden = bridgeAvailable || !servedHere;
    notice.hidden = false;
    noticeShown = true;
    if (bridgeAvailable) setState('disconnected', 'Not connected (Bluetooth is not available here: connect through this server)');
    else setState('unsupported', 'Bluetooth is not available on this page');
  }

  checkSupport();
})();

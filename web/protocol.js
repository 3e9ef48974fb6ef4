// The BLEControl frames of docs/protocol.md, for the control page.
// A classic script (not a module): module scripts do not load from a page
// opened as a local file, and the page must work that way too.
(function (global) {
  'use strict';

  /** Command codes: frames are `command, length, data`, values big-endian. */
  const Command = Object.freeze({
    INIT: 0x00,
    ANALOG_OUT_EN: 0x01,
    SERVO_VAL: 0x02,
    PWM_VAL: 0x03,
    LCD_TEXT: 0x04,
    LCD_CLEAR: 0x05,
    SWITCH_VAL: 0x06,
    ERROR: 0xFF,
  });

  const names = new Map(Object.entries(Command).map(([name, code]) => [code, name]));

  /** The name of a command code ("SERVO_VAL"), or its hex for unknown codes. */
  function commandName(code) {
    return names.get(code) || 'command 0x' + hex([code]);
  }

  // The demo app builds SERVO_VAL and PWM_VAL values from an Int16: a
  // negative slider value goes out as its two's complement (-500 is FE 0C),
  // which the board reads as a duty above 1000, i.e. 100 %.
  function u16(value) {
    const raw = Math.round(value) & 0xFFFF;
    return [raw >> 8, raw & 0xFF];
  }

  function byte(value, what) {
    if (!Number.isInteger(value) || value < 0 || value > 255) throw new RangeError(what + ' must be 0…255, got ' + value);
    return value;
  }

  /** ANALOG_OUT_EN: start (on) or stop a channel. */
  function enable(channel, on) {
    return [Command.ANALOG_OUT_EN, 2, byte(channel, 'channel'), on ? 1 : 0];
  }

  /** SERVO_VAL: a pulse of 1000 + value µs. */
  function servo(channel, value) {
    return [Command.SERVO_VAL, 3, byte(channel, 'channel'), ...u16(value)];
  }

  /** PWM_VAL: a duty of value/1000. */
  function pwm(channel, value) {
    return [Command.PWM_VAL, 3, byte(channel, 'channel'), ...u16(value)];
  }

  /** SWITCH_VAL: a digital output on or off. */
  function switchValue(index, on) {
    return [Command.SWITCH_VAL, 2, byte(index, 'switch'), on ? 1 : 0];
  }

  /** LCD_CLEAR: blanks the display. */
  function lcdClear() {
    return [Command.LCD_CLEAR, 0];
  }

  /** The most text bytes one LCD_TEXT frame can carry (its length byte counts the line and the 00 too). */
  const maximumTextBytes = 253;

  /**
   * The text a line can show: control characters dropped (a 00 inside the
   * text would end the frame early; the board's display has no use for the
   * others) and cut, on a character boundary, to what one frame carries.
   */
  function displayText(text) {
    // eslint-disable-next-line no-control-regex
    let clean = String(text).replace(/[\u0000-\u001F\u007F]/g, '');
    const encoder = new TextEncoder();
    while (encoder.encode(clean).length > maximumTextBytes) clean = Array.from(clean).slice(0, -1).join('');
    return clean;
  }

  /**
   * LCD_TEXT: replaces one line. The length is declared in bytes + 2 (the
   * line and the closing 00), the rule of docs/protocol.md, not the
   * original library's characters + 2.
   */
  function lcdText(line, text) {
    const bytes = Array.from(new TextEncoder().encode(displayText(text)));
    return [Command.LCD_TEXT, bytes.length + 2, byte(line, 'line'), ...bytes, 0];
  }

  /** Bytes as upper-case hex pairs: "02 03 00 01 F4". */
  function hex(bytes) {
    return Array.from(bytes, (b) => b.toString(16).toUpperCase().padStart(2, '0')).join(' ');
  }

  /**
   * Reassembles the board's notifications into frames. FFE1 is a byte
   * stream, so one notification may hold several frames or part of one.
   */
  class ReplyDecoder {
    constructor() {
      this.buffer = [];
    }

    /** Adds received bytes; returns the frames now complete, each {command, data, bytes}. */
    push(bytes) {
      this.buffer.push(...bytes);
      const frames = [];
      while (this.buffer.length >= 2 && this.buffer.length >= 2 + this.buffer[1]) {
        const length = this.buffer[1];
        const frame = this.buffer.splice(0, 2 + length);
        frames.push({ command: frame[0], data: frame.slice(2), bytes: frame });
      }
      return frames;
    }

    /** Drops a partial frame (a new connection starts clean). */
    reset() {
      this.buffer = [];
    }
  }

  /** What a reply frame means, in words. */
  function describeReply(frame) {
    if (frame.command === Command.ERROR && frame.data.length === 1) {
      return 'ERROR: the board could not execute ' + commandName(frame.data[0]);
    }
    return commandName(frame.command) + ' from the board';
  }

  global.BLEControlProtocol = Object.freeze({
    Command, commandName, enable, servo, pwm, switchValue, lcdClear, lcdText, displayText,
    maximumTextBytes, hex, ReplyDecoder, describeReply,
  });
})(window);

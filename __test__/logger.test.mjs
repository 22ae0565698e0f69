// The `logger` option: diagnostics go to the app's logger, fields first as pino takes them,
// filtered by `logLevel`, kept out of the bounded `events()` buffers, and never fatal.
import assert from 'node:assert/strict'
import { Console } from 'node:console'
import { PassThrough } from 'node:stream'
import { test } from 'node:test'

import { Protocol, ProtocolError } from '../js/index.js'
import { PLAINTEXT, record, strayAddress, unsignedControlFrame, until, waitFor } from './helpers.mjs'

const LEVELS = ['debug', 'info', 'warn', 'error']

/**
 * A stand-in for pino that reads its arguments as pino does: an object first is the log line's
 * fields and a string after it the message; a string first is the message, and further
 * arguments only fill its `%s` placeholders (here there are none, so they are dropped).
 */
function pinoLike() {
  const lines = []
  const logger = {}
  for (const level of LEVELS) {
    logger[level] = (first, ...rest) => {
      if (typeof first === 'object' && first !== null) lines.push({ level, ...first, msg: rest[0] })
      else lines.push({ level, msg: first })
    }
  }
  return { logger, lines }
}

/**
 * A device that can be made to log: a frame for another device over its app carrier is a debug
 * diagnostic; an unsigned control frame a warn diagnostic, then a `security_warning`.
 */
function device(extra) {
  const protocol = new Protocol({ appId: 'test', storage: { memory: true }, encryption: PLAINTEXT, ...extra })
  protocol.registerTransport('pipe', { send: async () => {} })
  return protocol
}

/** Another device's address: a frame for it that reaches this one is only carried. */
const elsewhere = await strayAddress()

const notForMe = JSON.stringify({
  id: 'carried-1', sender: 'mallory', recipient: elsewhere, app_id: 'test', priority: 'medium',
  ttl: 5, hop_count: 0, timestamp: 0, lamport_clock: 0, content_type: 'text', content: 'hi',
  metadata: {}, requires_ack: true, reply_to_msg: null,
})

/** Makes `protocol` log at debug, then at warn; resolves once the warning's event is dispatched. */
async function logTwice(protocol, recorder) {
  protocol.receiveFrame('pipe', 'mallory', notForMe)
  protocol.receiveFrame('pipe', 'mallory', unsignedControlFrame(protocol.localAddress()))
  await waitFor(recorder, (e) => e.type === 'security_warning')
}

test('diagnostics go to the logger pino-style, at or above logLevel, and not to events()', async (t) => {
  const { logger, lines } = pinoLike()
  const p = device({ logger })
  const recorder = record(p)
  const diagnostics = []
  p.on('diagnostic', (e) => diagnostics.push(e))
  const controller = new AbortController()
  const iterated = (async () => {
    const seen = []
    for await (const event of p.events({ signal: controller.signal })) {
      seen.push(event)
      if (event.type === 'security_warning') controller.abort()
    }
    return seen
  })()
  await p.start()
  t.after(() => p.stop())
  await logTwice(p, recorder)

  // The default logLevel, 'warn': the debug diagnostic was never produced.
  assert.deepEqual(lines, [{ level: 'warn', target: 'courier_engine', msg: `dropped control frame forged-1 from mallory: UNSIGNED_CONTROL_REJECTED` }])
  assert.deepEqual(diagnostics, [{ type: 'diagnostic', level: 'warn', target: 'courier_engine', message: lines[0].msg }], 'listeners still get diagnostics')
  const seen = await iterated
  assert.ok(seen.some((e) => e.type === 'security_warning'))
  assert.deepEqual(seen.filter((e) => e.type === 'diagnostic'), [], 'with a logger, events() carries no diagnostics')
})

test('console as the logger prints the fields and the message; logLevel debug lets debug through', async (t) => {
  const out = new PassThrough()
  const chunks = []
  out.on('data', (c) => chunks.push(c))
  const logger = new Console({ stdout: out, stderr: out, colorMode: false })
  const p = device({ logger, logLevel: 'debug' })
  const recorder = record(p)
  await p.start()
  t.after(() => p.stop())
  await logTwice(p, recorder)
  const printed = Buffer.concat(chunks).toString('utf8')
  assert.ok(printed.includes(`{ target: 'courier_engine' } carried copy of carried-1 for ${elsewhere} from mallory not delivered: not addressed to this device\n`), printed)
  assert.match(printed, /^\{ target: 'courier_engine' \} dropped control frame forged-1 from mallory: UNSIGNED_CONTROL_REJECTED$/m)
})

test('a logger that throws is reported as a warning and changes nothing else', async (t) => {
  const warnings = []
  const onWarning = (w) => warnings.push(w)
  process.on('warning', onWarning)
  t.after(() => process.off('warning', onWarning))
  const broken = { debug() {}, info() {}, error() {}, warn() { throw new Error('disk full') } }
  const p = device({ logger: broken })
  const recorder = record(p)
  await p.start()
  t.after(() => p.stop())
  await logTwice(p, recorder)
  assert.ok(recorder.events.some((e) => e.type === 'diagnostic' && e.level === 'warn'), 'listeners still get the diagnostic')
  await until(() => warnings.some((w) => w.name === 'OfflineCourierLoggerError'), { what: 'the logger warning' })
  assert.match(warnings.find((w) => w.name === 'OfflineCourierLoggerError').message, /disk full/)
  assert.ok(await p.sendMessage('ghost', 'still working'))
})

test('a logger without the four methods is ERR_CONFIG naming the missing one', () => {
  const config = (logger) => ({ appId: 'test', storage: { memory: true }, logger })
  const refused = (logger, message) =>
    assert.throws(() => new Protocol(config(logger)), (e) => {
      assert.ok(e instanceof ProtocolError)
      assert.equal(e.code, 'ERR_CONFIG')
      assert.equal(e.message, message)
      return true
    })
  refused({}, 'logger.debug must be a function')
  refused({ debug() {}, info() {}, warn() {} }, 'logger.error must be a function')
  refused({ debug() {}, info: 'yes', warn() {}, error() {} }, 'logger.info must be a function')
  refused('console', 'logger must be an object with debug, info, warn and error methods')
  refused(null, 'logger must be an object with debug, info, warn and error methods')
  // Accepted, so the option stayed on this side: the native config refuses keys it does not know.
  assert.ok(new Protocol(config(console)))
})

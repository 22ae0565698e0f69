// The public API's contract: typed errors with stable codes, validation that names the path.
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { test } from 'node:test'

import { Protocol, ProtocolError, issueToken } from '../js/index.js'
import { PLAINTEXT, peerConfig, startRelay, tempDir } from './helpers.mjs'

const require = createRequire(import.meta.url)
const native = require('../native.js')

const base = (dir) => ({ appId: 'test', storage: { path: `${dir}/p.db` }, encryption: PLAINTEXT })

function throwsCode(fn, code, pattern) {
  assert.throws(fn, (e) => {
    assert.ok(e instanceof ProtocolError, `expected ProtocolError, got ${e}`)
    assert.ok(e instanceof Error)
    assert.equal(e.code, code)
    if (pattern) assert.match(e.message, pattern)
    return true
  })
}

async function rejectsCode(promise, code, pattern) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof ProtocolError, `expected ProtocolError, got ${e}`)
    assert.equal(e.code, code)
    if (pattern) assert.match(e.message, pattern)
    return true
  })
}

test('invalid configs throw ERR_CONFIG naming the offending path', (t) => {
  const dir = tempDir(t)
  assert.ok(new Protocol(base(dir)))
  throwsCode(() => new Protocol({ ...base(dir), reliability: { retry: { initialDelayMs: 5000, maxDelayMs: 1000 } } }), 'ERR_CONFIG', /reliability\.retry\.initialDelayMs must be <= maxDelayMs/)
  throwsCode(() => new Protocol({ ...base(dir), bogus: 1 }), 'ERR_CONFIG', /bogus/)
  throwsCode(() => new Protocol({ ...base(dir), reliability: { ack: { defaultTimeoutMs: 'soon' } } }), 'ERR_CONFIG', /reliability\.ack\.defaultTimeoutMs/)
  throwsCode(() => new Protocol({ appId: 'test' }), 'ERR_CONFIG', /storage/)
  throwsCode(() => new Protocol({ ...base(dir), transports: { internet: { url: 'ws://example.com', authToken: 'x' } } }), 'ERR_CONFIG', /loopback/)
  throwsCode(() => new Protocol({ ...base(dir), transports: { internet: { url: 'ws://127.0.0.1:1' } } }), 'ERR_CONFIG', /authToken/)
  throwsCode(() => new Protocol(null), 'ERR_CONFIG')
})

test('native errors carry their code as data, and the message is only the message', async (t) => {
  const dir = tempDir(t)
  const nativeCode = (e) => ({ code: e.code, message: e.message })
  assert.throws(() => new native.NativeProtocol('{"appId": "test"}'), (e) => {
    assert.deepEqual(nativeCode(e), { code: 'ERR_CONFIG', message: 'storage is required (set storage.path or storage.memory)' })
    return true
  })
  const p = new native.NativeProtocol(JSON.stringify(base(dir)))
  assert.throws(() => p.stats(), (e) => {
    assert.deepEqual(nativeCode(e), { code: 'ERR_NOT_STARTED', message: 'the protocol is not started' })
    return true
  })
  // A rejected native Promise carries its code the same way.
  await assert.rejects(p.getMessageStatus('m'), (e) => {
    assert.deepEqual(nativeCode(e), { code: 'ERR_NOT_STARTED', message: 'the protocol is not started' })
    return true
  })
  await assert.rejects(native.NativeRelay.startFromArgs(['--listen', 'nowhere']), (e) => {
    assert.equal(e.code, 'ERR_CONFIG')
    assert.doesNotMatch(e.message, /ERR_/)
    return true
  })
  // Through the facade: a ProtocolError with the same code and message, and the native error,
  // with its stack, as its cause.
  await rejectsCode(new Protocol(base(dir)).getMessageStatus('m'), 'ERR_NOT_STARTED', /^the protocol is not started$/)
  throwsCode(() => new Protocol({ appId: 'test' }), 'ERR_CONFIG', /^storage is required/)
  assert.throws(() => new Protocol(base(dir)).stats(), (e) => {
    assert.ok(e instanceof ProtocolError)
    assert.ok(e.cause instanceof Error && !(e.cause instanceof ProtocolError), `cause: ${e.cause}`)
    assert.deepEqual(nativeCode(e.cause), { code: 'ERR_NOT_STARTED', message: 'the protocol is not started' })
    assert.equal(typeof e.cause.stack, 'string')
    return true
  })
  // An error the facade raises itself has no cause.
  await assert.rejects(new Protocol(base(dir)).getMessageStatus(7), (e) => e.code === 'ERR_INVALID_ARGUMENT' && !('cause' in e))
})

test('stats cross from the native side as plain objects of numbers', async (t) => {
  const dir = tempDir(t)
  const secretFile = `${dir}/secret`
  writeFileSync(secretFile, 'stats-secret-0123456789abcdef-0123')
  const relay = await native.NativeRelay.startFromArgs(['--listen', '127.0.0.1:0', '--memory', '--jwt-secret-file', secretFile])
  t.after(() => relay.stop())
  assert.deepEqual(relay.stats(), { connections: 0, accounts: 0, storedFrames: 0, watches: 0 })

  const p = new native.NativeProtocol(JSON.stringify(base(dir)))
  await p.start(() => {}, () => {}, () => {}, () => {})
  t.after(() => p.stop())
  const stats = p.stats()
  assert.equal(Object.getPrototypeOf(stats), Object.prototype)
  assert.deepEqual(stats, { outboxRegular: 0, outboxMedia: 0, pendingAcks: 0, retryQueue: 0, parked: 0, carriersUp: 0, preSession: 0, groupSends: 0 })
})

test('the three reliability presets of docs/delivery.md are accepted as written', (t) => {
  const dir = tempDir(t)
  const presets = [
    { ack: { defaultTimeoutMs: 15000 }, retry: { maxRetries: 20, outboxMaxLifetimeMs: 2592000000 } },
    { ack: { defaultTimeoutMs: 5000 }, retry: { maxRetries: 5, maxDelayMs: 10000 } },
    { retry: { maxRetries: 3, initialDelayMs: 5000, maxDelayMs: 60000 } },
  ]
  for (const reliability of presets) assert.ok(new Protocol({ ...base(dir), reliability }))
})

test('bad sends are refused with ERR_INVALID_ARGUMENT and change nothing', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const p = new Protocol(peerConfig('alice', dir, relay.url))
  await rejectsCode(p.sendMessage('bob', 'early'), 'ERR_NOT_STARTED')
  await p.start()
  t.after(() => p.stop())
  await rejectsCode(p.start(), 'ERR_ALREADY_STARTED')
  await rejectsCode(p.sendMessage('bob', 'x'.repeat(256 * 1024 + 1)), 'ERR_INVALID_ARGUMENT', /^content is 262145 bytes; the limit is 262144 \(send larger content with sendMedia\)$/)
  assert.ok(await p.sendMessage('bob', 'x'.repeat(256 * 1024)))
  for (const prefix of ['__MLS_ENC__', '__GRP_x', '__CTRL_x', '__FILE_x', '__ACK_x']) {
    await rejectsCode(p.sendMessage('bob', `${prefix}payload`), 'ERR_INVALID_ARGUMENT', /reserved/)
  }
  await rejectsCode(p.sendMessage('', 'x'), 'ERR_INVALID_ARGUMENT', /recipient/)
  await rejectsCode(p.sendMessage('a/b', 'x'), 'ERR_INVALID_ARGUMENT', /recipient/)
  await rejectsCode(p.sendMessage('bob', 'x', { priority: 'urgent' }), 'ERR_INVALID_ARGUMENT', /priority/)
  await rejectsCode(p.sendMessage('bob', 'x', { colour: 'red' }), 'ERR_INVALID_ARGUMENT', /colour/)
  await rejectsCode(p.sendMessage('bob', 'x', { metadata: { ack_for: 'm' } }), 'ERR_INVALID_ARGUMENT', /reserved/)
  await rejectsCode(p.sendMessage('bob', 42), 'ERR_INVALID_ARGUMENT', /content/)
  assert.equal(p.stats().outboxRegular, 1)
})

test('events() iterates in order and ends on abort', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const p = new Protocol(peerConfig('alice', dir, relay.url))
  const controller = new AbortController()
  const iterator = p.events({ signal: controller.signal })
  await p.start()
  t.after(() => p.stop())
  const seen = []
  let id
  for await (const event of iterator) {
    seen.push(event)
    if (event.type === 'internet_status_changed' && event.connected) id = await p.sendMessage('nobody-known', 'x')
    if (id !== undefined && event.messageId === id) controller.abort()
  }
  const connectedAt = seen.findIndex((e) => e.type === 'internet_status_changed')
  assert.ok(connectedAt >= 0)
  assert.ok(seen.findIndex((e) => e.messageId === id) > connectedAt, 'events arrived out of order')
  assert.ok(seen.some((e) => e.messageId === id))
})

test('a second Protocol on the same storage file is refused in the same process; a stopped one restarts', async (t) => {
  const dir = tempDir(t)
  const first = new Protocol(base(dir))
  await first.start()
  const second = new Protocol(base(dir))
  await rejectsCode(second.start(), 'ERR_STORAGE', /lock|in use|locked/i)
  const id = await first.sendMessage('bob', 'kept across a restart')
  await first.stop()
  await rejectsCode(first.sendMessage('bob', 'after stop'), 'ERR_NOT_STARTED')
  await first.start()
  assert.equal(await first.getMessageStatus(id), 'queued')
  assert.equal(first.stats().outboxRegular, 1)
  await first.stop()
  await second.start()
  assert.equal(await second.getMessageStatus(id), 'queued')
  await second.stop()
})

test('concurrent start() calls: one starts, the other is ERR_ALREADY_STARTED', async (t) => {
  const dir = tempDir(t)
  const p = new Protocol(base(dir))
  const results = await Promise.allSettled([p.start(), p.start()])
  assert.equal(results.filter((r) => r.status === 'fulfilled').length, 1)
  const rejected = results.find((r) => r.status === 'rejected')
  assert.equal(rejected.reason.code, 'ERR_ALREADY_STARTED')
  await p.stop()
})

test('the identity is created once, persisted, and announced at every start', async (t) => {
  const dir = tempDir(t)
  const p = new Protocol(base(dir))
  assert.throws(() => p.localAddress(), (e) => e.code === 'ERR_NOT_STARTED')
  const events = []
  p.onEvent((e) => events.push(e))
  await p.start()
  const address = p.localAddress()
  assert.match(address, /^off1[a-z0-9]{40}$/)
  await p.stop()
  await p.start()
  assert.equal(p.localAddress(), address, 'a restart must keep the identity')
  await p.stop()
  const ready = events.filter((e) => e.type === 'identity_ready')
  assert.deepEqual(ready.map((e) => e.address), [address, address])
  const other = new Protocol({ appId: 'test', storage: { path: `${dir}/other.db` } })
  await other.start()
  assert.notEqual(other.localAddress(), address, 'each storage file is its own identity')
  await other.stop()
})

test('storage.identitySealKey seals the identity: the same key opens it, a missing or wrong one fails start', async (t) => {
  const dir = tempDir(t)
  const key = new Uint8Array(32).fill(3)
  const sealed = (identitySealKey) => new Protocol({ appId: 'test', storage: { path: `${dir}/s.db`, identitySealKey } })
  throwsCode(() => sealed(new Uint8Array(31)), 'ERR_CONFIG', /storage\.identitySealKey must be exactly 32 bytes/)
  throwsCode(() => sealed('not bytes'), 'ERR_CONFIG', /storage\.identitySealKey must be a Uint8Array/)

  const p = sealed(key)
  await p.start()
  const address = p.localAddress()
  await p.stop()
  // A Buffer view over a larger allocation carries just its own 32 bytes.
  const view = Buffer.concat([Buffer.alloc(5, 9), Buffer.from(key)]).subarray(5)
  const again = sealed(view)
  await again.start()
  assert.equal(again.localAddress(), address)
  await again.stop()

  const missing = new Protocol({ appId: 'test', storage: { path: `${dir}/s.db` } })
  await rejectsCode(missing.start(), 'ERR_STORAGE', /identitySealKey/)
  await rejectsCode(sealed(new Uint8Array(32).fill(4)).start(), 'ERR_STORAGE', /does not open/)
  // Nothing was replaced: the right key still opens the same identity.
  const last = sealed(key)
  await last.start()
  assert.equal(last.localAddress(), address)
  await last.stop()
})

test('Relay.start and Gateway.start options are validated natively, naming the path', async (t) => {
  const { Relay, Gateway } = await import('../js/index.js')
  const base = { storage: { memory: true }, jwtSecret: 'options-secret-0123456789abcdef-01' }
  for (const [options, pattern] of [
    [null, /^options must be an object$/],
    [{ ...base, mailbx: {} }, /^mailbx is not a known option$/],
    [{ ...base, JwtSecret: 'x' }, /^JwtSecret is not a known option \(did you mean jwtSecret\?\)$/],
    [{ jwtSecret: 's' }, /^storage is required/],
    [{ ...base, storage: {} }, /^storage must set exactly one of path or memory$/],
    [{ ...base, storage: { path: 'a.db', memory: true } }, /^storage must set exactly one of path or memory, not both$/],
    [{ ...base, jwtSecret: '' }, /^jwtSecret must be a string of at least 32 bytes$/],
    [{ ...base, jwtSecret: 'secret' }, /^jwtSecret must be a string of at least 32 bytes$/],
    [{ ...base, listen: 'nowhere' }, /^listen must be an address like 127\.0\.0\.1:0/],
    [{ ...base, listen: 8080 }, /^listen must be a string$/],
    [{ ...base, mailbox: true }, /^mailbox must be false or an object$/],
    [{ ...base, mailbox: { maxmessages: 5 } }, /^mailbox\.maxmessages is not a known option \(did you mean maxMessages\?\)$/],
    [{ ...base, mailbox: { maxMessages: 0 } }, /^mailbox\.maxMessages must be a positive integer$/],
    [{ ...base, mailbox: { maxBytes: 1.5 } }, /^mailbox\.maxBytes must be a positive integer$/],
    [{ ...base, mailbox: { ttlMs: NaN } }, /^mailbox\.ttlMs must be a positive integer$/],
    [{ ...base, mailbox: { ttlMs: 2 ** 60 } }, /^mailbox\.ttlMs must be at most 9007199254740992$/],
    [{ ...base, rateLimit: { burst: 2 ** 32 } }, /^rateLimit\.burst must be at most 4294967295$/],
    [{ ...base, rateLimit: { perSec: -1 } }, /^rateLimit\.perSec must be a positive integer$/],
    [{ ...base, rateLimit: 5 }, /^rateLimit must be an object$/],
    [{ ...base, tls: { cert: 'pem' } }, /^tls\.key is required/],
    [{ ...base, authLimits: { attemptsperaccount: {} } }, /^authLimits\.attemptsperaccount is not a known option \(did you mean attemptsPerAccount\?\)$/],
    [{ ...base, authLimits: { displacementsPerAccount: { perMinute: 0 } } }, /^authLimits\.displacementsPerAccount\.perMinute must be a positive integer$/],
    [{ ...base, presenceVisibility: 'friends' }, /^presenceVisibility must be 'everyone' or 'contacts', got "friends"$/],
  ]) {
    await rejectsCode(Relay.start(options), 'ERR_CONFIG', pattern)
  }
  for (const [options, pattern] of [
    ['127.0.0.1:0', /^options must be an object$/],
    [{ Listen: '127.0.0.1:0' }, /^Listen is not a known option \(did you mean listen\?\)$/],
    [{ listen: 4242 }, /^listen must be a string$/],
    [{ listen: 'localhost' }, /^listen must be an address like 127\.0\.0\.1:0/],
    [{ requireToken: 'short' }, /^requireToken must hold at least 16 bytes$/],
    [{ requireToken: 'a-token-long-enough', allowPublicWithoutToken: true }, /^allowPublicWithoutToken cannot be combined with requireToken$/],
    [{ maxQueueBytes: 0 }, /^maxQueueBytes must be a positive integer$/],
    [{ idleTimeoutMs: 1.5 }, /^idleTimeoutMs must be a positive integer$/],
    [{ rateLimit: { burst: 0 } }, /^rateLimit\.burst must be a positive integer$/],
  ]) {
    await rejectsCode(Gateway.start(options), 'ERR_CONFIG', pattern)
  }

  // Every option at once, with a Buffer secret; null is the same as leaving a key out.
  const relay = await Relay.start({
    listen: '127.0.0.1:0',
    storage: { memory: true },
    jwtSecret: Buffer.from('options-secret-0123456789abcdef-01'),
    mailbox: { maxMessages: 10, maxBytes: 1024, ttlMs: 60_000 },
    rateLimit: { burst: 10, perSec: 5 },
    authLimits: { attemptsPerSource: { burst: 5 }, attemptsPerAccount: { burst: 3, perMinute: 1 }, displacementsPerAccount: { perMinute: 2 } },
    presenceVisibility: 'contacts',
    tls: null,
  })
  t.after(() => relay.stop())
  assert.match(relay.url, /^ws:\/\/127\.0\.0\.1:\d+$/)
  const gateway = await Gateway.start()
  t.after(() => gateway.stop())
  assert.match(gateway.address, /^127\.0\.0\.1:\d+$/)
  // Valid options, but the address is taken: the server cannot start.
  await rejectsCode(Relay.start({ ...base, listen: `127.0.0.1:${relay.port}` }), 'ERR_RELAY')
  await rejectsCode(Gateway.start({ listen: gateway.address }), 'ERR_RELAY')
  // Beyond loopback only with a token or the explicit opt-out; a queue under one line is refused.
  await rejectsCode(Gateway.start({ listen: '0.0.0.0:0' }), 'ERR_RELAY')
  await rejectsCode(Gateway.start({ maxQueueBytes: 1024 }), 'ERR_RELAY')
  const guarded = await Gateway.start({
    requireToken: 'a-token-long-enough',
    maxConnections: 10,
    maxConnectionsPerSource: 2,
    maxQueueBytes: 2 ** 21,
    idleTimeoutMs: 5000,
    rateLimit: { burst: 5, perSec: 1 },
  })
  t.after(() => guarded.stop())
  assert.match(guarded.address, /^127\.0\.0\.1:\d+$/)
})

test('issueToken refuses a secret short enough to guess, and sets iat', () => {
  for (const secret of ['', 'secret', 'x'.repeat(31), Buffer.from('x'.repeat(31))]) {
    assert.throws(() => issueToken(secret, 'alice'), { code: 'ERR_INVALID_ARGUMENT', message: /at least 32 bytes/ })
  }
  const token = issueToken('x'.repeat(32), 'alice', { expiresInSec: 60 })
  const claims = JSON.parse(Buffer.from(token.split('.')[1], 'base64url').toString('utf8'))
  assert.equal(claims.sub, 'alice')
  assert.equal(claims.exp - claims.iat, 60)
})

test('plaintext mode is warned about once per process, however many devices use it', () => {
  const script = `
    const { Protocol } = require(${JSON.stringify(require.resolve('../js/index.js'))})
    const warnings = []
    process.on('warning', (w) => warnings.push(w.name + ': ' + w.message))
    new Protocol({ appId: 'a', storage: { memory: true }, encryption: { enabled: false } })
    new Protocol({ appId: 'b', storage: { memory: true }, encryption: { enabled: false } })
    new Protocol({ appId: 'c', storage: { memory: true } })
    setImmediate(() => console.log(JSON.stringify(warnings)))
  `
  const warnings = JSON.parse(execFileSync(process.execPath, ['-e', script], { encoding: 'utf8' }))
  assert.equal(warnings.length, 1, JSON.stringify(warnings))
  assert.match(warnings[0], /^OfflineCourierConfigWarning: encryption\.enabled is false: messages travel .* in the clear/)
})

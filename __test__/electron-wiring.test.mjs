// The protocol wiring of the Electron example (`examples/electron/courier.js`), driven with the
// calls its `main.js` makes: start under a userData folder with a seal-key store and a token
// provider, send, `resume()` on wake, network hints, `stop()` on quit. Electron itself cannot run
// here, and nothing below pretends to be Electron: the seal-key store is a plain file-backed
// object implementing the module's `{ read, write }` interface (in the app, `safeStorage` over a
// file), and the relay is a real one on loopback.
//
// How `offline-courier` resolves: `startCourier` takes the package as its `offlineCourier` option,
// which defaults to `require('offline-courier')`: in the app, npm installed it beside the
// example. Here the example is not installed, so the test passes this repository's build,
// `js/index.js`, loaded with `require` exactly as the package's `require` export resolves it.
// The default itself is therefore not exercised here; resolving the published package is what
// `consumer.test.mjs` covers.
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { test } from 'node:test'

import { CourierStartError, SEAL_KEY_BYTES, startCourier } from '../examples/electron/courier.js'
import { SECRET, startRelay, tempDir, until, waitFor } from './helpers.mjs'

const offlineCourier = createRequire(import.meta.url)('../js/index.js')

/** The seal-key store `startCourier` takes, over a file; counts its writes. */
function fileKeyStore(dir) {
  const file = join(dir, 'seal-key')
  const store = {
    writes: 0,
    read: () => (existsSync(file) ? readFileSync(file) : null),
    write(key) {
      store.writes += 1
      writeFileSync(file, key, { mode: 0o600 })
    },
  }
  return store
}

/** The event sink `startCourier` takes, recording for `waitFor`. */
function eventSink() {
  const recorder = { events: [], waiters: new Set() }
  recorder.sink = (event) => {
    recorder.events.push(event)
    for (const waiter of [...recorder.waiters]) waiter(event)
  }
  return recorder
}

/** What main.js hands to `startCourier`, for device `account`, plus the test's probes. */
function device(t, relay, account, { userData = tempDir(t), store = fileKeyStore(userData) } = {}) {
  const events = eventSink()
  const tokens = { asked: 0 }
  const options = {
    userData,
    sealKeyStore: store,
    relayUrl: relay.url,
    authToken: async () => {
      tokens.asked += 1
      return offlineCourier.issueToken(SECRET, account)
    },
    onEvent: events.sink,
    offlineCourier,
  }
  return { options, userData, store, events, tokens }
}

async function start(t, options) {
  const courier = await startCourier(options)
  t.after(() => courier.stop())
  return courier
}

const status = (connected) => (e) => e.type === 'internet_status_changed' && e.connected === connected
/** `predicate`, for events from index `from` on. */
const since = (recorder, from, predicate) => (e) => recorder.events.indexOf(e) >= from && predicate(e)

test('a first start keeps a new seal key and the database under userData; a sealed message is delivered; a restart keeps the address', async (t) => {
  const relay = await startRelay(t)
  const bob = device(t, relay, 'bob')
  const bobCourier = await start(t, bob.options)
  // Bob is reachable at his address once the relay has read his declaration and drained.
  await waitFor(bob.events, (e) => e.type === 'inbound_drain_completed', { what: 'bob online' })

  const alice = device(t, relay, 'alice')
  assert.equal(alice.store.read(), null)
  let courier = await start(t, alice.options)
  const key = alice.store.read()
  assert.equal(key.length, SEAL_KEY_BYTES)
  assert.equal(alice.store.writes, 1)
  assert.ok(existsSync(join(alice.userData, 'courier.db')), 'the database is under userData')
  assert.match(courier.address, /^off1/)
  const ready = await waitFor(alice.events, (e) => e.type === 'identity_ready')
  assert.equal(ready.address, courier.address)
  await waitFor(alice.events, status(true), { what: 'alice online' })
  assert.ok(alice.tokens.asked >= 1, 'the connect asked the token provider')

  const id = await courier.send(bobCourier.address, 'hello from the desktop')
  const received = await waitFor(bob.events, (e) => e.type === 'message_received' && e.messageId === id, { what: 'the message at bob' })
  assert.equal(received.content, 'hello from the desktop')
  assert.equal(received.encrypted, true)
  assert.equal(received.sender, courier.address)
  await waitFor(alice.events, (e) => e.type === 'message_delivered' && e.messageId === id, { what: "bob's ACK" })

  const address = courier.address
  await courier.stop()
  await until(() => relay.stats().connections === 1, { what: 'the relay to see alice leave' })
  courier = await start(t, alice.options)
  assert.equal(courier.address, address, 'the same identity, opened with the stored key')
  assert.equal(alice.store.writes, 1, 'the key is created once')
  assert.deepEqual(alice.store.read(), key)
})

test('resume() redials at once, and network hints take the connection down and up', async (t) => {
  const relay = await startRelay(t)
  const alice = device(t, relay, 'alice')
  const courier = await start(t, alice.options)
  const { events } = alice
  await waitFor(events, status(true), { what: 'alice online' })

  let mark = events.events.length
  courier.resume()
  await waitFor(events, since(events, mark, status(false)), { what: 'the connection dropped by resume()' })
  mark = events.events.length
  await waitFor(events, since(events, mark, status(true)), { what: 'the redial after resume()' })

  mark = events.events.length
  courier.networkHint(false)
  await waitFor(events, since(events, mark, status(false)), { what: 'offline after the hint' })
  mark = events.events.length
  courier.networkHint(true)
  await waitFor(events, since(events, mark, status(true)), { what: 'online after the hint' })
  assert.ok(alice.tokens.asked >= 3, 'every connect asked for a token')
})

test('a second start on the same userData is DATABASE_IN_USE; a wrong seal key is ERR_STORAGE and keeps the identity', async (t) => {
  const relay = await startRelay(t)
  const alice = device(t, relay, 'alice')
  const first = await start(t, alice.options)
  const address = first.address
  const dbPath = join(alice.userData, 'courier.db')

  await assert.rejects(startCourier(alice.options), (e) => {
    assert.ok(e instanceof CourierStartError)
    assert.equal(e.code, 'DATABASE_IN_USE')
    assert.ok(e.message.includes(dbPath), e.message)
    assert.equal(e.cause.code, 'ERR_STORAGE')
    return true
  })
  await first.stop()

  // Another key than the one the identity was sealed with: refused, and nothing is replaced.
  const wrong = { read: () => randomBytes(SEAL_KEY_BYTES), write: () => assert.fail('a key exists; none may be written') }
  await assert.rejects(startCourier({ ...alice.options, sealKeyStore: wrong }), (e) => {
    assert.ok(e instanceof offlineCourier.ProtocolError)
    assert.equal(e.code, 'ERR_STORAGE')
    return true
  })
  // The key is gone (a reset keychain): named, and no new key is minted over the identity.
  const lost = { read: () => null, write: () => assert.fail('a new key would not open the identity') }
  await assert.rejects(startCourier({ ...alice.options, sealKeyStore: lost }), (e) => e instanceof CourierStartError && e.code === 'SEAL_KEY_MISSING')
  const short = { read: () => Buffer.alloc(16), write: () => assert.fail('unreachable') }
  await assert.rejects(startCourier({ ...alice.options, sealKeyStore: short }), (e) => e instanceof CourierStartError && e.code === 'SEAL_KEY_INVALID')

  const again = await start(t, alice.options)
  assert.equal(again.address, address)
})

// End-to-end encryption from the public API: `encryption: { enabled: true }` seals every message
// in an MLS session between the two devices, addressed by `localAddress()`; the first message to
// a device that is offline is sealed at once from the relay's key-package directory, or — with
// the relay's `keyDirectory: false` — waits in the pre-session queue (`stats().preSession`) until
// the device's next start answers. `message_received.encrypted` says it arrived sealed.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { ProtocolError } from '../js/index.js'
import { peerConfig, startRelay, started, tempDir, until, waitFor } from './helpers.mjs'

const sealed = (name, dir, url) => peerConfig(name, dir, url, { encryption: { enabled: true }, logLevel: 'info' })
const published = (e) => e.type === 'diagnostic' && e.message.includes('holds 10 one-time')

/** Bob is online once (long enough for the directory to hold his packages, when it exists). */
async function bobOnceThenGone(t, dir, relay, directory) {
  const bob = await started(t, sealed('bob', dir, relay.url))
  if (directory) await waitFor(bob.recorder, published, { what: "bob's key packages in the directory" })
  const address = bob.protocol.localAddress()
  await bob.protocol.stop()
  await until(() => relay.stats().connections === 0, { what: 'the relay to see bob leave' })
  return address
}

for (const directory of [true, false]) {
  test(`a first message to an offline device arrives sealed on its next start (directory ${directory ? 'on' : 'off'})`, async (t) => {
    const dir = tempDir(t)
    const relay = await startRelay(t, { keyDirectory: directory })
    const bobAddress = await bobOnceThenGone(t, dir, relay, directory)

    const alice = await started(t, sealed('alice', dir, relay.url))
    const id = await alice.protocol.sendMessage(bobAddress, 'only for bob')
    if (directory) {
      await waitFor(alice.recorder, (e) => e.type === 'message_stored' && e.messageId === id, { what: 'the sealed message in the mailbox' })
      assert.equal(alice.protocol.stats().preSession, 0)
    } else {
      assert.equal(alice.protocol.stats().preSession, 1, 'it waits for the session')
      const deferred = await waitFor(alice.recorder, (e) => e.type === 'message_deferred' && e.messageId === id)
      assert.match(deferred.reason, /session/)
    }

    const bob = await started(t, sealed('bob', dir, relay.url))
    const got = await waitFor(bob.recorder, (e) => e.type === 'message_received', { what: 'the message at bob' })
    assert.equal(got.content, 'only for bob')
    assert.equal(got.sender, alice.protocol.localAddress())
    assert.equal(got.encrypted, true)
    await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { what: "bob's sealed ACK" })
    assert.equal(alice.protocol.stats().preSession, 0)

    // And back, in the session Bob joined.
    const reply = await bob.protocol.sendMessage(alice.protocol.localAddress(), 'got it')
    const back = await waitFor(alice.recorder, (e) => e.type === 'message_received', { what: 'the reply at alice' })
    assert.equal(back.content, 'got it')
    assert.equal(back.encrypted, true)
    await waitFor(bob.recorder, (e) => e.type === 'message_delivered' && e.messageId === reply)
  })
}

test('with encryption a recipient must be an address; without it, messages say they came in the clear', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await started(t, sealed('alice', dir, relay.url))
  await assert.rejects(alice.protocol.sendMessage('bob', 'hi'), (e) => e instanceof ProtocolError && e.code === 'ERR_INVALID_ARGUMENT')
  assert.equal(alice.protocol.stats().outboxRegular + alice.protocol.stats().preSession, 0)

  const carol = await started(t, peerConfig('carol', dir, relay.url))
  const dave = await started(t, peerConfig('dave', dir, relay.url))
  await carol.protocol.sendMessage('dave', 'in the clear')
  const got = await waitFor(dave.recorder, (e) => e.type === 'message_received')
  assert.equal(got.encrypted, false)
})

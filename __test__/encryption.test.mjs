// End-to-end encryption from the public API: by default every message is sealed in an MLS session
// between the two devices, addressed by `localAddress()`; the first message to
// a device that is offline is sealed at once from the relay's key-package directory, or — with
// the relay's `keyDirectory: false` — waits in the pre-session queue (`stats().preSession`) until
// the device's next start answers. `message_received.encrypted` says it arrived sealed.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { ProtocolError } from '../js/index.js'
import { PipeCarrier } from './pipe-carrier.mjs'
import { PLAINTEXT, peerConfig, startRelay, started, tempDir, until, waitFor } from './helpers.mjs'

/** A device as an app configures it by default: no `encryption` key, so sealed. */
function sealed(name, dir, url) {
  const { encryption, ...config } = peerConfig(name, dir, url, { logLevel: 'info' })
  assert.equal(encryption, PLAINTEXT)
  return config
}
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

test('by default a recipient must be an address; in plaintext mode every frame says it is in the clear', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const alice = await started(t, sealed('alice', dir, relay.url))
  await assert.rejects(alice.protocol.sendMessage('bob', 'hi'), (e) => e instanceof ProtocolError && e.code === 'ERR_INVALID_ARGUMENT')
  assert.equal(alice.protocol.stats().outboxRegular + alice.protocol.stats().preSession, 0)

  // Two devices in plaintext mode, linked by an app carrier that shows what travels.
  const pipe = new PipeCarrier()
  const local = (name) => ({ appId: 'test', storage: { path: `${dir}/${name}.db` }, encryption: PLAINTEXT })
  const carol = await started(t, local('carol'), { connect: false })
  const dave = await started(t, local('dave'), { connect: false })
  pipe.attach('carol', carol.protocol)
  pipe.attach('dave', dave.protocol)
  pipe.link()
  const id = await carol.protocol.sendMessage('dave', 'in the clear')
  const got = await waitFor(dave.recorder, (e) => e.type === 'message_received')
  assert.equal(got.encrypted, false)
  await waitFor(carol.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  const frames = pipe.delivered.map((f) => JSON.parse(f.frame))
  const message = frames.find((m) => m.sender === carol.protocol.localAddress() && m.content === 'in the clear')
  assert.equal(message?.encrypted, false, 'the message says it travels in the clear')
  const ack = frames.find((m) => m.metadata.ack_for !== undefined)
  assert.equal(ack?.encrypted, false, 'so does its ACK')
})

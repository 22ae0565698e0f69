// Every public event, made to occur with a real relay, a gateway and an app carrier, then
// checked against js/index.d.ts by compiling each one, as it arrived, with tsc: a key or a value
// type that differs between the producer (crates/courier-client/src/event.rs) and the typings,
// an event type the typings do not declare, and a declared event type or key that never occurs
// all fail this test.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

import { Gateway, Protocol } from '../js/index.js'
import { PLAINTEXT, peerConfig, record, sealedFrame, startRelay, started, tempDir, typeCheck, unsignedControlFrame, until, waitFor } from './helpers.mjs'

/** Declared keys no run of this test can produce, and why. */
const NOT_PRODUCED_HERE = {
  // Only a process killed between committing a terminal event and dispatching it replays one
  // (the crash run covers that).
  message_delivered: ['replayed'],
  message_failed: ['replayed'],
  connection_request_undeliverable: ['replayed'],
}

/** An event as TypeScript source (JSON, except for the bytes of a binary message). */
function literal(value) {
  if (value instanceof Uint8Array) return `new Uint8Array(${JSON.stringify([...value])})`
  if (Array.isArray(value)) return `[${value.map(literal).join(', ')}]`
  if (value !== null && typeof value === 'object') {
    return `{ ${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${literal(v)}`).join(', ')} }`
  }
  return JSON.stringify(value)
}

/** The keys and the JS type of each value: events of one shape need compiling once. */
const shape = (event) =>
  Object.keys(event)
    .sort()
    .map((k) => `${k}:${event[k] === null ? 'null' : typeof event[k]}`)
    .join(',')

/** A TypeScript file that compiles only if every event matches its declared type. */
function typeCheckSource(events) {
  const byType = new Map()
  for (const event of events) {
    if (!byType.has(event.type)) byType.set(event.type, new Map())
    byType.get(event.type).set(shape(event), event)
  }
  const typings = fileURLToPath(new URL('../js/index.js', import.meta.url))
  const union = (names) => (names.length === 0 ? 'never' : names.map((n) => JSON.stringify(n)).join(' | '))
  const lines = [
    `import type { ProtocolEvent } from ${JSON.stringify(typings)}`,
    `type Declared<T extends ProtocolEvent['type']> = Extract<ProtocolEvent, { type: T }>`,
    '/** Fails to compile, naming what is left, unless `T` is `never`. */',
    'type Empty<T extends never> = T',
    '// Every declared event type occurred.',
    `export type UnseenTypes = Empty<Exclude<ProtocolEvent['type'], ${union([...byType.keys()])}>>`,
  ]
  let n = 0
  for (const [type, samples] of byType) {
    const declared = `Declared<'${type}'>`
    lines.push(`// ${type}: each shape it arrived in is exactly its declared type.`)
    for (const event of samples.values()) lines.push(`export const sample${n++}: ${declared} = ${literal(event)}`)
    const seen = new Set([...samples.values()].flatMap((e) => Object.keys(e)))
    const excused = [...seen, ...(NOT_PRODUCED_HERE[type] ?? [])]
    lines.push(`export type UnseenKeys_${type} = Empty<Exclude<keyof Declared<'${type}'>, ${union(excused)}>>`)
  }
  return `${lines.join('\n')}\n`
}

/** An app carrier that takes every frame and delivers none: sends to it time out unacknowledged. */
const blackHole = { send: async () => {} }

test('every public event occurs, and each matches its declared type', async (t) => {
  const dir = tempDir(t)
  const recorders = []
  const watch = (peer) => {
    recorders.push(peer.recorder)
    return peer
  }

  // A message to a known peer that is offline is stored by the relay; one to an account the
  // relay never saw is undeliverable, and parked.
  const relay = await startRelay(t)
  const bobBefore = watch(await started(t, peerConfig('bob', dir, relay.url)))
  await bobBefore.protocol.stop()
  await until(() => relay.stats().connections === 0, { what: 'the relay to see bob leave' })
  const alice = watch(await started(t, peerConfig('alice', dir, relay.url, { logLevel: 'info' })))
  const stored = await alice.protocol.sendMessage('bob', 'kept by the relay')
  await waitFor(alice.recorder, (e) => e.type === 'message_stored' && e.messageId === stored)
  // The recipient of a message in the relay's custody is watched; the relay knows when bob left.
  await waitFor(alice.recorder, (e) => e.type === 'presence_updated' && e.peerId === 'bob' && e.lastSeenMs > 0)
  const parked = await alice.protocol.sendMessage('nobody-known', 'to nobody')
  await waitFor(alice.recorder, (e) => e.type === 'message_undeliverable' && e.messageId === parked)
  await waitFor(alice.recorder, (e) => e.type === 'presence_updated' && e.peerId === 'nobody-known' && !e.online)
  // A file chunk's verdict names its file.
  const lostFile = await alice.protocol.sendMedia('nobody-known', new Uint8Array(100))
  await waitFor(alice.recorder, (e) => e.type === 'message_undeliverable' && e.fileId === lostFile)

  // Bob comes back: the stored message drains, and a live one follows.
  const bob = watch(await started(t, peerConfig('bob', dir, relay.url)))
  await waitFor(bob.recorder, (e) => e.type === 'inbound_drain_completed')
  const binary = await alice.protocol.sendMessage('bob', new Uint8Array([0, 1, 255]), { contentType: 'file', metadata: { k: 'v' } })
  for (const id of [stored, binary]) {
    await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id, { what: `${id} received` })
    await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { what: `${id} delivered` })
  }
  await waitFor(alice.recorder, (e) => e.type === 'internet_server_message')
  // A reply with a quote, mentions and extras, and a forward of it: every rich field of a
  // received message set.
  const reply = await alice.protocol.sendMessage('bob', 'a reply', {
    replyTo: stored,
    quote: { text: 'kept by the relay', sender: 'alice', messageId: stored },
    mentions: ['bob'],
    extras: { k: [1, { n: null }] },
  })
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === reply && e.quote !== null)
  const forward = await bob.protocol.forwardMessage(reply, 'alice')
  await waitFor(alice.recorder, (e) => e.type === 'message_received' && e.messageId === forward && e.forwardInfo !== null)

  // A device with only an app carrier that loses every frame: the message waits for a carrier,
  // then times out unacknowledged, then fails.
  const lonely = new Protocol({
    appId: 'test',
    storage: { path: `${dir}/lonely.db` },
    encryption: PLAINTEXT,
    reliability: { ack: { defaultTimeoutMs: 100 }, retry: { maxRetries: 1, initialDelayMs: 10, maxDelayMs: 10 } },
  })
  lonely.registerTransport('void', blackHole)
  const lonelyEvents = record(lonely)
  recorders.push(lonelyEvents)
  await lonely.start()
  t.after(() => lonely.stop())
  const lost = await lonely.sendMessage('ghost', 'into the void')
  await waitFor(lonelyEvents, (e) => e.type === 'message_deferred' && e.messageId === lost)
  lonely.neighborDiscovered('ghost', 'void')
  await waitFor(lonelyEvents, (e) => e.type === 'neighbor_discovered' && e.peerId === 'ghost')
  await waitFor(lonelyEvents, (e) => e.type === 'message_retrying' && e.messageId === lost)
  await waitFor(lonelyEvents, (e) => e.type === 'message_failed' && e.messageId === lost)
  lonely.neighborLost('ghost', 'void')
  await waitFor(lonelyEvents, (e) => e.type === 'neighbor_lost' && e.peerId === 'ghost')
  // A control frame without a valid signature is reported.
  lonely.receiveFrame('void', 'mallory', unsignedControlFrame(lonely.localAddress()))
  await waitFor(lonelyEvents, (e) => e.type === 'security_warning')
  // A sealed frame on a device without encryption is reported, never shown.
  lonely.receiveFrame('void', 'mallory', sealedFrame(lonely.localAddress()))
  await waitFor(lonelyEvents, (e) => e.type === 'message_decryption_failed' && e.code === 'ENCRYPTION_DISABLED')

  // Connection requests (by address, in plaintext mode too): one accepted, one declined, one
  // withdrawn, and one to an address the relay never saw, which is never parked.
  // Each answer is awaited before the next request: a request to a peer with one still waiting
  // is that same request.
  const bobAddress = bob.protocol.localAddress()
  const ask = async (options) => {
    const id = await alice.protocol.sendConnectionRequest(bobAddress, options)
    await waitFor(bob.recorder, (e) => e.type === 'connection_request_received' && e.requestId === id)
    return id
  }
  const accepted = await ask({ message: 'hi, bob' })
  await bob.protocol.acceptConnection(accepted)
  await waitFor(alice.recorder, (e) => e.type === 'connection_accepted' && e.requestId === accepted)
  const rejected = await ask()
  await bob.protocol.rejectConnection(rejected)
  await waitFor(alice.recorder, (e) => e.type === 'connection_rejected' && e.requestId === rejected)
  const withdrawn = await ask()
  await alice.protocol.cancelConnectionRequest(withdrawn)
  await waitFor(bob.recorder, (e) => e.type === 'connection_request_cancelled' && e.requestId === withdrawn)
  const nowhere = await alice.protocol.sendConnectionRequest(lonely.localAddress())
  await waitFor(alice.recorder, (e) => e.type === 'connection_request_undeliverable' && e.requestId === nowhere)

  // A device attached to a gateway.
  const gateway = await Gateway.start()
  t.after(() => gateway.stop())
  const attached = watch(
    await started(t, { appId: 'test', storage: { path: `${dir}/attached.db` }, transports: { gateway: { address: gateway.address } } }, { connect: false }),
  )
  await waitFor(attached.recorder, (e) => e.type === 'gateway_status_changed' && e.attached)

  // A second session for alice's account supersedes the first.
  watch(await started(t, { ...peerConfig('alice', dir, relay.url), storage: { path: `${dir}/alice-phone.db` } }))
  await waitFor(alice.recorder, (e) => e.type === 'internet_session_superseded')

  // A token the relay refuses, and a token provider with none: both typed.
  const withToken = (name, authToken) => ({ ...peerConfig(name, dir, relay.url), transports: { internet: { url: relay.url, authToken } } })
  const refused = watch(await started(t, withToken('mallory', 'not.a.jwt'), { connect: false }))
  await waitFor(refused.recorder, (e) => e.type === 'auth_failed' && e.reason === 'invalid_token')
  const tokenless = watch(await started(t, withToken('trent', () => Promise.reject(new Error('no token today'))), { connect: false }))
  await waitFor(tokenless.recorder, (e) => e.type === 'auth_failed' && e.reason === 'token_unavailable')

  // A group of sealed devices (the default mode): created, a message broadcast and reported,
  // a member added and removed.
  const sealedPeer = async (name) => {
    const { encryption, ...config } = peerConfig(name, dir, relay.url, { logLevel: 'info' })
    void encryption
    const peer = watch(await started(t, config))
    await waitFor(peer.recorder, (e) => e.type === 'diagnostic' && e.message.includes('holds 10 one-time'))
    return { ...peer, address: peer.protocol.localAddress() }
  }
  const gina = await sealedPeer('gina')
  const hank = await sealedPeer('hank')
  const ivan = await sealedPeer('ivan')
  const groupId = await gina.protocol.createGroup('events', [hank.address])
  await waitFor(gina.recorder, (e) => e.type === 'group_relay_sync_changed' && e.synced)
  await waitFor(hank.recorder, (e) => e.type === 'group_created' && e.groupId === groupId)
  const groupMessage = await gina.protocol.sendGroupMessage(groupId, 'to the group')
  await waitFor(gina.recorder, (e) => e.type === 'group_message_sent' && e.messageId === groupMessage)
  await waitFor(hank.recorder, (e) => e.type === 'message_received' && e.groupId === groupId)
  await waitFor(gina.recorder, (e) => e.type === 'group_message_delivery_report' && e.messageId === groupMessage)
  await waitFor(gina.recorder, (e) => e.type === 'group_message_member_status' && e.messageId === groupMessage)
  await gina.protocol.addGroupMember(groupId, ivan.address)
  await waitFor(hank.recorder, (e) => e.type === 'group_member_added' && e.member === ivan.address)
  await gina.protocol.removeGroupMember(groupId, ivan.address)
  await waitFor(ivan.recorder, (e) => e.type === 'group_member_removed' && e.member === ivan.address)

  // Files: one delivered, one refused by the receiver's bounds, and one from bytes that a
  // restart lost.
  const fileId = await gina.protocol.sendMedia(hank.address, new Uint8Array(3000), {
    fileName: 'a.bin', contentType: 'application/octet-stream', caption: 'a file', replyTo: groupMessage, metadata: { k: 'v' },
  })
  await waitFor(hank.recorder, (e) => e.type === 'file_received' && e.fileId === fileId)
  await waitFor(hank.recorder, (e) => e.type === 'file_progress' && e.fileId === fileId)
  await waitFor(gina.recorder, (e) => e.type === 'file_progress' && e.fileId === fileId)
  await waitFor(gina.recorder, (e) => e.type === 'file_delivered' && e.fileId === fileId)
  await ivan.protocol.stop()
  const { encryption, ...picky } = peerConfig('ivan', dir, relay.url, { media: { maxFileSize: 1000 } })
  void encryption
  const ivanAgain = watch(await started(t, picky))
  const refusedFile = await gina.protocol.sendMedia(ivan.address, new Uint8Array(3000))
  await waitFor(ivanAgain.recorder, (e) => e.type === 'file_failed' && e.fileId === refusedFile)
  const packerConfig = { appId: 'test', storage: { path: `${dir}/packer.db` }, encryption: PLAINTEXT }
  const packer = new Protocol(packerConfig)
  packer.registerTransport('void', blackHole)
  await packer.start()
  await packer.sendMedia('ghost', new Uint8Array(10), { fileId: 'lost-bytes' })
  await packer.stop()
  const unpacked = new Protocol(packerConfig)
  const unpackedEvents = record(unpacked)
  recorders.push(unpackedEvents)
  await unpacked.start()
  t.after(() => unpacked.stop())
  await waitFor(unpackedEvents, (e) => e.type === 'media_resend_required' && e.fileId === 'lost-bytes')

  const events = recorders.flatMap((r) => r.events)
  const source = typeCheckSource(events)
  const result = typeCheck(source)
  assert.equal(result.status, 0, `the events do not match js/index.d.ts:\n${result.stdout}${result.stderr}\n${source}`)
  // Every type that occurred (so, by the check above, every declared one) can be subscribed to.
  for (const type of new Set(events.map((e) => e.type))) assert.equal(typeof lonely.on(type, () => {}), 'function')
})

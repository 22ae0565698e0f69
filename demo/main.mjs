// The main job, end to end: an embedded relay with a SQLite mailbox and peers with their own
// SQLite outboxes, every message sealed end to end (the default) and addressed to a device
// address. Shows a live delivery, a recipient that is offline (relay custody), a sender that is
// offline (deferred, then flushed on reconnect), an offline sender killed with SIGKILL right after
// `sendMessage` resolved that delivers after it restarts, and a first message to a device that
// has never been online, sent the moment it appears, and a file sent with `sendMedia` whose
// progress both sides show live while its recipient drops off the network partway. Prints a
// timeline, explains two of alice's messages from her ledger, and draws her ledger as an HTML
// page with `courier-relay inspect` (its path is printed; it outlives the run); exits 0.
import { spawn, spawnSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { createReadStream, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { pipeline } from 'node:stream/promises'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'

import { Protocol, Relay, issueToken } from '../js/index.js'
import { createScreen, mib } from './screen.mjs'

const SECRET = 'demo-secret-please-change-0123456789'
const dir = mkdtempSync(join(tmpdir(), 'offline-courier-demo-'))
const t0 = Date.now()
const DEADLINE_MS = 30_000
/** Large enough that the transfer takes a few seconds through a relay on loopback. */
const FILE_SIZE = 24 * 1024 * 1024
/** How long the recipient of the file stays off the network, long enough to see both bars stall. */
const OFFLINE_MS = 1500

/** Devices are known by their addresses; the timeline shows whose each is. */
const who = (address) => names.get(address) ?? address
const screen = createScreen({ nameOf: who, t0 })
const { log, print } = screen

function describe(e) {
  switch (e.type) {
    case 'message_sent': return `sent ${e.messageId.slice(0, 8)} → ${who(e.recipient)} over ${e.transport} (attempt ${e.attempt})`
    case 'message_stored': return `relay holds ${e.messageId.slice(0, 8)} in ${who(e.recipient)}'s mailbox (custody, not delivery)`
    case 'message_deferred': return `deferred ${e.messageId.slice(0, 8)}: ${e.reason}`
    case 'message_retrying': return `retrying ${e.messageId.slice(0, 8)} (retry ${e.retryCount})`
    case 'message_delivered': return `DELIVERED ${e.messageId.slice(0, 8)} to ${who(e.recipient)} in ${e.latencyMs} ms`
    case 'message_failed': return `FAILED ${e.messageId.slice(0, 8)}: ${e.reason}`
    case 'message_received': return `received "${e.content}" from ${who(e.sender)}${e.encrypted ? ', sealed end to end' : ''}`
    case 'identity_ready': return `identity ${e.address}`
    case 'internet_status_changed': return e.connected ? 'relay connected' : 'relay disconnected'
    case 'message_undeliverable': return `PARKED ${e.messageId.slice(0, 8)}: ${who(e.recipient)} is unreachable (kept, probed, re-driven when it appears)`
    case 'presence_updated': return `${who(e.peerId)} is ${e.online ? 'online' : 'offline'}`
    case 'inbound_drain_completed': return `mailbox drained (${e.count} waiting frame${e.count === 1 ? '' : 's'})`
    case 'file_received': return `received file ${e.fileName} (${mib(e.size)}) from ${who(e.sender)}: ${e.path}`
    case 'file_delivered': return `FILE DELIVERED ${e.fileId.slice(0, 8)} to ${who(e.recipient)}: every chunk of ${mib(e.size)} acknowledged`
    case 'file_failed': return `FILE FAILED ${e.fileId.slice(0, 8)} (${e.direction}, ${who(e.peer)}): ${e.reason}`
    default: return null
  }
}

function peer(name) {
  const protocol = new Protocol({
    appId: 'demo',
    storage: { path: join(dir, `${name}.db`) },
    transports: { internet: { url: relay.url, authToken: issueToken(SECRET, name) } },
    reliability: { ack: { defaultTimeoutMs: 5000 } },
    media: { directory: join(dir, `${name}-media`) },
  })
  const events = []
  const waiters = new Set()
  protocol.onEvent((e) => {
    if (e.type === 'identity_ready') names.set(e.address, name)
    if (e.type === 'file_progress') screen.progress(name, e)
    const line = describe(e)
    if (line) log(name, line)
    events.push(e)
    for (const w of [...waiters]) w(e)
  })
  const waitFor = (predicate, what) =>
    new Promise((resolve, reject) => {
      const hit = events.find(predicate)
      if (hit) return resolve(hit)
      const timer = setTimeout(() => reject(new Error(`${name}: no ${what} within ${DEADLINE_MS / 1000} s`)), DEADLINE_MS)
      const check = (e) => {
        if (!predicate(e)) return
        clearTimeout(timer)
        waiters.delete(check)
        resolve(e)
      }
      waiters.add(check)
    })
  return { name, protocol, waitFor }
}

const names = new Map()

/** A device's identity, made on its storage without connecting: its address, to send to. */
async function identityOf(name) {
  const protocol = new Protocol({ appId: 'demo', storage: { path: join(dir, `${name}.db`) } })
  await protocol.start()
  const address = protocol.localAddress()
  await protocol.stop()
  names.set(address, name)
  return address
}

const connected = (e) => e.type === 'internet_status_changed' && e.connected
const deliveredId = (id) => (e) => e.type === 'message_delivered' && e.messageId === id
const receivedId = (id) => (e) => e.type === 'message_received' && e.messageId === id

/** The first event of transfer `fileId` at `peer` that `wanted` accepts; a `file_failed` throws. */
async function transferReaches(peer, fileId, what, wanted) {
  const e = await peer.waitFor((e) => e.fileId === fileId && (e.type === 'file_failed' || wanted(e)), what)
  if (e.type === 'file_failed') throw new Error(`${peer.name}: the transfer failed: ${e.reason}`)
  return e
}

async function sha256(path) {
  const hash = createHash('sha256')
  await pipeline(createReadStream(path), hash)
  return hash.digest('hex')
}

/** Runs a sender in its own process and kills it with SIGKILL as soon as its send is durable. */
function sendThenKill(recipient, content) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [fileURLToPath(new URL('./crash-sender.mjs', import.meta.url))], {
      env: {
        ...process.env,
        DEMO_DB: join(dir, 'carol.db'),
        // A closed port: carol's network is down while she sends.
        DEMO_URL: 'ws://127.0.0.1:9',
        DEMO_TOKEN: issueToken(SECRET, 'carol'),
        DEMO_TO: recipient,
        DEMO_CONTENT: content,
      },
      stdio: ['ignore', 'pipe', 'inherit'],
    })
    createInterface({ input: child.stdout }).once('line', (id) => {
      child.kill('SIGKILL')
      child.once('exit', (_code, signal) => resolve({ id, signal }))
    })
    child.once('error', reject)
  })
}

const relay = await Relay.start({ listen: '127.0.0.1:0', storage: { path: join(dir, 'relay.db') }, jwtSecret: SECRET })
log('relay', `listening on ${relay.url} (mailbox in relay.db)`)

try {
  const alice = peer('alice')
  const bob = peer('bob')
  await alice.protocol.start()
  await bob.protocol.start()
  await Promise.all([alice.waitFor(connected, 'connection'), bob.waitFor(connected, 'connection')])
  const bobAddress = bob.protocol.localAddress()

  print('\n— 1. live delivery, sealed in a session set up from the relay\'s key directory —')
  const live = await alice.protocol.sendMessage(bobAddress, 'hello bob')
  log('alice', `sendMessage resolved: ${live.slice(0, 8)} is durably in the outbox`)
  await alice.waitFor(deliveredId(live), 'delivery')

  print('\n— 2. the recipient is offline: the relay keeps the message —')
  await bob.protocol.stop()
  log('bob', 'stopped (offline)')
  const stored = await alice.protocol.sendMessage(bobAddress, 'are you there?')
  await alice.waitFor((e) => e.type === 'message_stored' && e.messageId === stored, 'custody')
  await bob.protocol.start()
  log('bob', 'started again')
  await bob.waitFor(receivedId(stored), 'the stored message')
  await alice.waitFor(deliveredId(stored), 'delivery')

  print('\n— 3. the sender is offline: deferred, then flushed on reconnect —')
  alice.protocol.internetStatusChanged(false)
  await alice.waitFor((e) => e.type === 'internet_status_changed' && !e.connected, 'disconnect')
  const deferred = await alice.protocol.sendMessage(bobAddress, 'written on a plane')
  await alice.waitFor((e) => e.type === 'message_deferred' && e.messageId === deferred, 'deferral')
  log('alice', `status of ${deferred.slice(0, 8)}: ${await alice.protocol.getMessageStatus(deferred)}`)
  alice.protocol.internetStatusChanged(true)
  await alice.waitFor(deliveredId(deferred), 'delivery')

  print('\n— 4. the sender is killed right after sendMessage resolved —')
  const { id: crashed, signal } = await sendThenKill(bobAddress, 'sent just before a crash')
  log('carol', `offline; sendMessage resolved ${crashed.slice(0, 8)}; process killed with ${signal}`)
  const carol = peer('carol')
  await carol.protocol.start()
  const restored = carol.protocol.stats()
  log('carol', `restarted with the network: ${restored.outboxRegular + restored.preSession} message restored from carol.db`)
  await bob.waitFor(receivedId(crashed), 'the message from carol')
  await carol.waitFor(deliveredId(crashed), 'delivery')
  log('carol', `status of ${crashed.slice(0, 8)}: ${await carol.protocol.getMessageStatus(crashed)}`)

  print('\n— 5. a device that has never been online: the message waits, watched by presence —')
  const daveAddress = await identityOf('dave')
  const waiting = await alice.protocol.sendMessage(daveAddress, 'welcome, dave')
  await alice.waitFor((e) => e.type === 'message_deferred' && e.messageId === waiting, 'the deferral')
  log('alice', `status of ${waiting.slice(0, 8)}: ${await alice.protocol.getMessageStatus(waiting)}; watching ${alice.protocol.internetPresenceWatchlist().map(who).join(', ')}`)
  const dave = peer('dave')
  await dave.protocol.start()
  log('dave', 'connected for the first time')
  await dave.waitFor(receivedId(waiting), 'the first message')
  await alice.waitFor(deliveredId(waiting), 'delivery')

  print('\n— 6. a file with live progress on both sides; the recipient drops off the network partway —')
  const original = join(dir, 'footage.bin')
  writeFileSync(original, randomBytes(FILE_SIZE))
  const fileId = await alice.protocol.sendMedia(bobAddress, original, {
    caption: 'raw footage from the field', contentType: 'application/octet-stream',
  })
  log('alice', `sendMedia resolved: ${fileId.slice(0, 8)} (${mib(FILE_SIZE)} read from footage.bin) is hashed and durably accepted`)
  const partway = await transferReaches(bob, fileId, '40 % of the file', (e) => e.type === 'file_progress' && e.bytes >= e.totalBytes * 0.4)
  bob.protocol.internetStatusChanged(false)
  log('bob', `goes offline with ${Math.floor((100 * partway.bytes) / partway.totalBytes)} % written; the relay keeps what alice sends meanwhile`)
  await sleep(OFFLINE_MS)
  log('bob', `back online after ${OFFLINE_MS / 1000} s`)
  bob.protocol.internetStatusChanged(true)
  const [received] = await Promise.all([
    transferReaches(bob, fileId, 'the file', (e) => e.type === 'file_received'),
    transferReaches(alice, fileId, 'its delivery', (e) => e.type === 'file_delivered'),
  ])
  screen.settle()
  const [sent, kept] = await Promise.all([sha256(original), sha256(received.path)])
  if (kept !== sent || received.sha256 !== sent) throw new Error(`bob's copy does not match: ${kept}, sent ${sent}`)
  log('bob', `${mib(received.size)}, "${received.caption}", SHA-256 ${kept.slice(0, 16)}… matches the original`)

  print('\n— 7. each message\'s life, from alice\'s ledger —')
  for (const id of [stored, waiting]) {
    const { sentence } = await alice.protocol.explainMessage(id)
    log('alice', `${id.slice(0, 8)}: ${sentence.replaceAll(/off1[a-z0-9]{40}/g, who)}`)
  }

  await Promise.all([alice.protocol.stop(), bob.protocol.stop(), carol.protocol.stop(), dave.protocol.stop()])
  print('\nEvery message settled in exactly one terminal event, message_delivered, and the file in file_delivered.')
  const picture = join(tmpdir(), `offline-courier-demo-${process.pid}.html`)
  const cli = fileURLToPath(new URL('../js/relay-cli.js', import.meta.url))
  const labels = [...names].flatMap(([address, name]) => ['--label', `${address}=${name}`])
  const inspect = spawnSync(process.execPath, [cli, 'inspect', join(dir, 'alice.db'), '--out', picture, ...labels], { encoding: 'utf8' })
  if (inspect.status !== 0) throw new Error(`courier-relay inspect failed: ${inspect.stderr}`)
  print(`alice's messages as a picture (courier-relay inspect alice.db): ${picture}`)
} finally {
  screen.settle()
  await relay.stop()
  rmSync(dir, { recursive: true, force: true })
}

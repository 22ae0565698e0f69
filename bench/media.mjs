// File transfer benchmark (`node bench/media.mjs [--size=64] [--runs=3]`, part of `npm run bench:all`):
// one file of `--size` MiB of random bytes sent with `sendMedia` between two sealed devices through
// a loopback relay (SQLite on disk), timed from the call to the receiver's `file_received` and to
// the sender's `file_delivered`; against the same file copied over a loopback TCP socket (read
// stream → socket → write stream, fsync at the end) and `fs.copyFile` + fsync (the disk's ceiling).
// Each further row changes one thing: the window, the chunk size, encryption off, the relay's
// storage in memory, a byte source. Per row: the CPU time of every thread of this process over
// the wall time, and its peak resident memory sampled every 100 ms (a transfer from a path is
// never held in memory). Figures go to BENCHMARKS.md; this is never part of `npm test`.
import { createHash, randomBytes } from 'node:crypto'
import { closeSync, copyFileSync, createReadStream, createWriteStream, fsyncSync, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs'
import { once } from 'node:events'
import { createServer, connect } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { Protocol, Relay, issueToken } from '../js/index.js'

const SECRET = 'bench-secret-0123456789abcdef-0123'
const MiB = 1024 * 1024
const args = new Map(process.argv.slice(2).map((a) => a.replace(/^--/, '').split('=')))
const SIZE_MIB = Number(args.get('size') ?? 64)
const RUNS = Number(args.get('runs') ?? 3)
// Generous: a deadline catches a stalled transfer, it does not time one.
const DEADLINE_MS = 600_000
const dir = mkdtempSync(join(tmpdir(), 'offline-courier-bench-media-'))

// Peak resident memory of this process (both devices, the relay and Node), per table row.
let peakRss = 0
const sampler = setInterval(() => {
  peakRss = Math.max(peakRss, process.memoryUsage.rss())
}, 100)

function writeSource(path) {
  const hash = createHash('sha256')
  const fd = openSync(path, 'w')
  for (let i = 0; i < SIZE_MIB; i++) {
    const block = randomBytes(MiB)
    hash.update(block)
    writeSync(fd, block)
  }
  fsyncSync(fd)
  closeSync(fd)
  return hash.digest('hex')
}

function fsyncPath(path) {
  const fd = openSync(path, 'r+')
  fsyncSync(fd)
  closeSync(fd)
}

async function copyFileRun(source, run) {
  const target = join(dir, `copy-${run}.bin`)
  const started = performance.now()
  copyFileSync(source, target)
  fsyncPath(target)
  const ms = performance.now() - started
  rmSync(target)
  return { ms }
}

async function socketRun(source, run) {
  const target = join(dir, `socket-${run}.bin`)
  const server = createServer()
  const written = new Promise((resolve, reject) => {
    server.once('connection', (socket) => {
      const out = createWriteStream(target)
      socket.pipe(out)
      out.once('error', reject)
      out.once('close', () => {
        fsyncPath(target)
        resolve()
      })
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const started = performance.now()
  const socket = connect(server.address().port, '127.0.0.1')
  await once(socket, 'connect')
  createReadStream(source).pipe(socket)
  await written
  const ms = performance.now() - started
  server.close()
  rmSync(target)
  return { ms }
}

function waitFor(events, predicate, what) {
  return new Promise((resolve, reject) => {
    const deadline = Date.now() + DEADLINE_MS
    const tick = () => {
      const found = events.find(predicate)
      if (found) return resolve(found)
      if (Date.now() > deadline) return reject(new Error(`timed out waiting for ${what}`))
      setTimeout(tick, 5)
    }
    tick()
  })
}

async function device(relay, name, { media = {}, clear = false } = {}) {
  const protocol = new Protocol({
    appId: 'bench',
    storage: { path: join(dir, `${name}.db`) },
    transports: { internet: { url: relay.url, authToken: issueToken(SECRET, name) } },
    media: { directory: join(dir, `${name}-media`), ...media },
    ...(clear ? { encryption: { enabled: false } } : {}),
  })
  const events = []
  protocol.onEvent((e) => {
    if (e.type === 'file_failed') console.error(`${name}: file_failed ${e.fileId}: ${e.reason}`)
    if (e.type !== 'diagnostic') events.push({ ...e, at: performance.now() })
  })
  await protocol.start()
  await waitFor(events, (e) => e.type === 'internet_status_changed' && e.connected, `${name} connected`)
  return { protocol, events }
}

/**
 * Alice and Bob; sealed, the session set up (a message and its ACK) before any clock starts.
 * In the clear (`clear`), Bob is addressed by his account name.
 */
async function pair(relay, label, { media, clear }) {
  const alice = await device(relay, `${label}-alice`, { media, clear })
  const bob = await device(relay, `${label}-bob`, { clear })
  const bobAddress = clear ? `${label}-bob` : bob.protocol.localAddress()
  const hello = await alice.protocol.sendMessage(bobAddress, 'hello')
  await waitFor(alice.events, (e) => e.type === 'message_delivered' && e.messageId === hello, 'the session')
  return { alice, bob, bobAddress }
}

async function courierRun({ alice, bob, bobAddress }, source, sha256, fileId) {
  const started = performance.now()
  await alice.protocol.sendMedia(bobAddress, source, { fileId, fileName: `${fileId}.bin` })
  const accepted = performance.now()
  const failed = (e) => e.type === 'file_failed' && e.fileId === fileId
  const received = await waitFor(bob.events, (e) => (e.type === 'file_received' || failed(e)) && e.fileId === fileId, `${fileId} at bob`)
  const delivered = await waitFor(alice.events, (e) => (e.type === 'file_delivered' || failed(e)) && e.fileId === fileId, `${fileId} delivered`)
  if (received.type !== 'file_received' || delivered.type !== 'file_delivered') throw new Error(`${fileId} failed`)
  if (received.sha256 !== sha256) throw new Error(`${fileId}: checksum ${received.sha256}, sent ${sha256}`)
  if (delivered.at < received.at) {
    // The receiver reports the file before its last ACK leaves, but the two devices' events
    // reach this one event loop through separate queues: a reversal of a fraction of a
    // millisecond is that, anything longer is worth a look.
    console.error(`${fileId}: file_delivered seen ${(received.at - delivered.at).toFixed(1)} ms before file_received`)
  }
  rmSync(received.path)
  return { ms: received.at - started, deliveredMs: delivered.at - started, acceptMs: accepted - started }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const rate = (ms) => SIZE_MIB / (ms / 1000)

async function row(name, run) {
  peakRss = process.memoryUsage.rss()
  const results = []
  let cpuMicros = 0
  let wallMs = 0
  for (let i = 0; i < RUNS; i++) {
    const cpu = process.cpuUsage()
    const started = performance.now()
    results.push(await run(i))
    wallMs += performance.now() - started
    const used = process.cpuUsage(cpu)
    cpuMicros += used.user + used.system
  }
  const rates = results.map((r) => rate(r.ms))
  const delivered = results.filter((r) => r.deliveredMs !== undefined).map((r) => rate(r.deliveredMs))
  const accept = results.filter((r) => r.acceptMs !== undefined).map((r) => r.acceptMs)
  return {
    name,
    median: median(rates),
    min: Math.min(...rates),
    max: Math.max(...rates),
    delivered: delivered.length ? median(delivered) : null,
    acceptMs: accept.length ? median(accept) : null,
    peakRssMiB: peakRss / MiB,
    // Every thread of this process (both devices, the relay, Node), per run and as cores busy.
    cpuSeconds: cpuMicros / 1e6 / RUNS,
    cores: cpuMicros / 1000 / wallMs,
  }
}

async function main() {
  const source = join(dir, 'source.bin')
  const sha256 = writeSource(source)
  const baselineMiB = process.memoryUsage.rss() / MiB
  const rows = []
  rows.push(await row('`fs.copyFile` + fsync (disk ceiling)', (i) => copyFileRun(source, i)))
  rows.push(await row('loopback TCP socket → file + fsync', (i) => socketRun(source, i)))
  const reference = rows[1].median

  const startRelay = (storage) =>
    Relay.start({ listen: '127.0.0.1:0', storage, jwtSecret: SECRET, rateLimit: { burst: 100_000, perSec: 100_000 } })
  const onDisk = await startRelay({ path: join(dir, 'relay.db') })
  const inMemory = await startRelay({ memory: true })
  // The first is the product's defaults; each other row changes one thing.
  const variants = [
    ['path, 256 KiB chunks, window 8, sealed (defaults)', 'default', {}],
    ['path, window 4', 'w4', { media: { window: 4 } }],
    ['path, window 16', 'w16', { media: { window: 16 } }],
    ['path, 64 KiB chunks', 'c64', { media: { chunkSize: 64 * 1024 } }],
    ['path, in the clear (encryption off)', 'clear', { clear: true }],
    ['path, relay storage in memory', 'memory', { relay: inMemory }],
    // Last: the bytes stay in this process's heap once read.
    ['bytes (`Uint8Array`)', 'bytes', { bytes: true }],
  ]
  for (const [name, label, variant] of variants) {
    const devices = await pair(variant.relay ?? onDisk, label, variant)
    const input = variant.bytes ? readFileSync(source) : source
    rows.push(await row(`courier: ${name}`, (i) => courierRun(devices, input, sha256, `${label}-${i}`)))
    await devices.alice.protocol.stop()
    await devices.bob.protocol.stop()
  }
  await onDisk.stop()
  await inMemory.stop()

  console.log(`${SIZE_MIB} MiB of random bytes, ${RUNS} runs each; resident memory before the first row ${baselineMiB.toFixed(0)} MiB\n`)
  console.log('| path | to `file_received`, MiB/s median (min–max) | vs socket | to `file_delivered` | `sendMedia` resolved | CPU per run (cores busy) | peak RSS |')
  console.log('|---|---|---|---|---|---|---|')
  for (const r of rows) {
    const delivered = r.delivered === null ? '' : `${r.delivered.toFixed(1)} MiB/s`
    const accept = r.acceptMs === null ? '' : `${r.acceptMs.toFixed(0)} ms`
    console.log(
      `| ${r.name} | ${r.median.toFixed(1)} (${r.min.toFixed(1)}–${r.max.toFixed(1)}) | ${(r.median / reference).toFixed(3)}× | ${delivered} | ${accept} | ${r.cpuSeconds.toFixed(1)} s (${r.cores.toFixed(2)}) | ${r.peakRssMiB.toFixed(0)} MiB |`,
    )
  }
}

try {
  await main()
} finally {
  clearInterval(sampler)
  rmSync(dir, { recursive: true, force: true })
}

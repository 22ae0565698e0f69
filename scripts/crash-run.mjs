#!/usr/bin/env node
// Crash runs: a real relay (the `courier-relay` command) and two chat apps, each in its own
// process, exchange a stream of messages while this script SIGKILLs one of the three at a
// random moment and restarts it on the same SQLite files (and the relay on the same port), again
// and again. After the last kill the apps keep sending for a while with everything up, then
// everything quiesces and the run is judged from what survived: every message whose sendMessage
// resolved is delivered exactly once to the recipient app's own inbox, with the content sent
// under its id, or failed with a documented reason, and its outcome is recorded exactly once. A
// message to the other app may fail only if a kill or a lost connection fell within its life:
// the calm tail after the last kill is where a lost end-to-end ACK has no such excuse.
//
//   npm run crash -- --kills 200 --seed 42
//
// The kill schedule (moments, victims, down times) is a function of --seed; the interleaving
// with the processes' own work is not, so a seed reproduces the schedule, not the exact run.
// Exits 1 on any violation and keeps the run's files for inspection.
//
// `--cluster` runs the relay as a cluster instead (docs/cluster.md): three NATS servers and two
// relay nodes over them, each SIGKILLed and restarted like the apps; the apps list both nodes and
// fail over between them.
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

import Database from 'better-sqlite3'

import { Protocol, issueToken } from '../js/index.js'
import { mulberry32 } from './crash/rng.mjs'
import { configureServers, freePort, natsBinary } from './nats-servers.mjs'
import { Supervised, deadline } from './crash/supervisor.mjs'
import { verify } from './crash/verify.mjs'

const RELAY_CLI = fileURLToPath(new URL('../js/relay-cli.js', import.meta.url))
const PEER = fileURLToPath(new URL('./crash/peer.mjs', import.meta.url))
const READY_MS = 30_000

const { values: opt } = parseArgs({
  options: {
    seed: { type: 'string' },
    kills: { type: 'string', default: '240' },
    'min-gap-ms': { type: 'string', default: '150' },
    'max-gap-ms': { type: 'string', default: '1200' },
    'max-down-ms': { type: 'string', default: '500' },
    'long-down-share': { type: 'string', default: '0.1' },
    'long-down-ms': { type: 'string', default: '4000' },
    'pause-ms': { type: 'string', default: '100' },
    'hook-delay-ms': { type: 'string', default: '10' },
    'ghost-share': { type: 'string', default: '0.02' },
    'lifetime-ms': { type: 'string', default: '30000' },
    'calm-ms': { type: 'string', default: '2000' },
    'quiesce-ms': { type: 'string', default: '180000' },
    keep: { type: 'boolean', default: false },
    encryption: { type: 'boolean', default: false },
    cluster: { type: 'boolean', default: false },
    json: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
})
if (opt.help) {
  console.log(`usage: node scripts/crash-run.mjs [options]
  --seed N          kill schedule seed (default: random, printed)
  --kills N         SIGKILLs across the relay and both apps (default 240)
  --min-gap-ms N    shortest pause between kills (default 150)
  --max-gap-ms N    longest pause between kills (default 1200)
  --max-down-ms N   longest time a killed process stays down (default 500)
  --long-down-share X  share of kills after which it stays down longer, so backlogs build
                    up in the relay and the outboxes (default 0.1)
  --long-down-ms N  longest such down time (default 4000)
  --pause-ms N      mean pause between an app's send bursts of 1-3 messages (default 100)
  --hook-delay-ms N mean pause of the durability hook after its commit, before it resolves (default 10)
  --ghost-share X   share of messages sent to an account that never connects (default 0.02)
  --encryption      every message sealed in MLS sessions (recipients by address)
  --cluster         the relay as three NATS servers and two relay nodes, all killed like the apps
  --lifetime-ms N   outbox lifetime, so those end in message_failed (default 30000)
  --calm-ms N       how long the apps go on sending once all three are up and connected after
                    the last kill (default 2000)
  --quiesce-ms N    how long the apps may take to settle everything after the last kill (default 180000)
  --keep            keep the run's files even when it passes
  --json            print the report as one JSON line`)
  process.exit(0)
}
const num = (name) => {
  const v = Number(opt[name])
  if (!Number.isFinite(v) || v < 0) throw new Error(`--${name} must be a non-negative number, got ${opt[name]}`)
  return v
}
const seed = opt.seed === undefined ? Math.floor(Math.random() * 2 ** 32) : num('seed') >>> 0
const kills = num('kills')
const [minGap, maxGap, maxDown] = [num('min-gap-ms'), num('max-gap-ms'), num('max-down-ms')]
const [longDownShare, longDown] = [num('long-down-share'), num('long-down-ms')]
const [calmMs, quiesceMs] = [num('calm-ms'), num('quiesce-ms')]

const say = (line) => opt.json || console.log(line)
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const random = mulberry32(seed)
const t0 = Date.now()
const dir = mkdtempSync(join(tmpdir(), 'courier-crash-'))
const secret = 'crash-run-secret-0123456789abcdef'
writeFileSync(join(dir, 'secret.txt'), secret)
const violations = []

// The relay's command line, less where it listens and keeps its state. Every kill of an app is
// a login of its account: the per-account limits would make the run about waiting them out.
const RELAY_ARGS = ['--jwt-secret-file', join(dir, 'secret.txt'), '--auth-attempts-per-account', '1000000', '--displacements-per-account', '1000000']
const relayReady = (line) => line.match(/listening on ws:\/\/127\.0\.0\.1:(\d+)/)?.slice(1)

/** The single-file relay: its first start picks a port; every restart binds it again on the same file. */
async function singleRelay() {
  let relayPort = 0
  const relay = new Supervised('relay', {
    args: () => [RELAY_CLI, '--listen', `127.0.0.1:${relayPort}`, '--db', join(dir, 'relay.db'), ...RELAY_ARGS],
    stderr: join(dir, 'relay.stderr'),
    ready: relayReady,
  })
  const [port] = await deadline(relay.start().ready, READY_MS, 'relay start')
  relayPort = Number(port)
  return { processes: [relay], urls: [`ws://127.0.0.1:${relayPort}`], stored: () => count(join(dir, 'relay.db'), 'SELECT COUNT(*) AS n FROM journal') }
}

/** Three NATS servers (each restarted on its ports and store) and two relay nodes over them. */
async function clusterRelay() {
  const binary = natsBinary()
  const configs = await configureServers(dir, 'crash-run')
  // Through a shell only to send each server's log to stdout, where readiness is read; `exec`
  // leaves the server itself as the process a kill reaches.
  const servers = configs.map(
    (server, i) =>
      new Supervised(`nats${i}`, {
        command: '/bin/sh',
        args: () => ['-c', `exec ${JSON.stringify(binary)} -c ${JSON.stringify(server.config)} 2>&1`],
        stderr: join(dir, `nats${i}.stderr`),
        ready: (line) => (line.includes('Server is ready') ? {} : null),
      }),
  )
  await Promise.all(servers.map((s) => deadline(s.start().ready, READY_MS, `${s.name} start`)))
  const nats = configs.map((s) => s.url).join(',')
  const nodePorts = [await freePort(), await freePort()]
  const nodes = nodePorts.map(
    (port, i) =>
      new Supervised(`node${i}`, {
        args: () => [RELAY_CLI, '--listen', `127.0.0.1:${port}`, '--cluster', nats, ...RELAY_ARGS],
        stderr: join(dir, `node${i}.stderr`),
        ready: relayReady,
      }),
  )
  await Promise.all(nodes.map((n) => deadline(n.start().ready, READY_MS, `${n.name} start`)))
  // The journal's frames as the stream's leader counts them.
  const stored = async () => {
    for (const server of configs) {
      try {
        const jsz = await (await fetch(`http://127.0.0.1:${server.monitor}/jsz?streams=true`)).json()
        const stream = jsz.account_details?.flatMap((a) => a.stream_detail ?? []).find((d) => d.name === 'courier-journal')
        if (stream && stream.cluster?.leader === server.name) return stream.state.messages
      } catch {
        // A server killed a moment ago: ask the next.
      }
    }
    return Infinity
  }
  return { processes: [...servers, ...nodes], urls: nodePorts.map((port) => `ws://127.0.0.1:${port}`), stored }
}

function count(path, sql) {
  const db = new Database(path, { readonly: true, fileMustExist: true, timeout: 5000 })
  try {
    return db.prepare(sql).get().n
  } finally {
    db.close()
  }
}

const relay = opt.cluster ? await clusterRelay() : await singleRelay()

/**
 * With --encryption recipients are addresses: each app's identity is made on its own storage
 * file before the run (the apps keep it), and the account that never connects is an address too.
 */
async function identity(storage) {
  const protocol = new Protocol({ appId: 'crash-run', storage, encryption: { enabled: true } })
  await protocol.start()
  const address = protocol.localAddress()
  await protocol.stop()
  return address
}
const addresses = opt.encryption
  ? {
      alice: await identity({ path: join(dir, 'alice.db') }),
      bob: await identity({ path: join(dir, 'bob.db') }),
      ghost: await identity({ memory: true }),
    }
  : { alice: 'alice', bob: 'bob', ghost: 'ghost' }

function peer(name, other) {
  const files = { storage: join(dir, `${name}.db`), inbox: join(dir, `${name}-inbox.db`), log: join(dir, `${name}.log`) }
  const proc = new Supervised(name, {
    args: () => [PEER],
    env: (incarnation) => ({
      CRASH_PEER: JSON.stringify({
        name,
        peer: addresses[other],
        ghost: addresses.ghost,
        encryption: opt.encryption,
        ghostShare: num('ghost-share'),
        pauseMs: num('pause-ms'),
        hookDelayMs: num('hook-delay-ms'),
        lifetimeMs: num('lifetime-ms'),
        relayUrl: relay.urls.length === 1 ? relay.urls[0] : relay.urls,
        token: issueToken(secret, name),
        send: true,
        seed: (seed ^ Math.imul(incarnation, 0x9e3779b1) ^ (name === 'alice' ? 0 : 0x5bd1e995)) >>> 0,
        ...files,
      }),
    }),
    stderr: join(dir, `${name}.stderr`),
    ready: (line) => (line.startsWith('{"ready"') ? JSON.parse(line) : null),
  })
  return Object.assign(proc, { files })
}
const alice = peer('alice', 'bob')
const bob = peer('bob', 'alice')
const peers = [alice, bob]
const all = [...relay.processes, alice, bob]
await Promise.all(peers.map((p) => deadline(p.start().ready, READY_MS, `${p.name} start`)))
say(`crash run: seed ${seed}, ${kills} kills, files in ${dir}`)

// The kill phase. Readiness is not awaited between kills: a kill may land during a start.
for (let k = 1; k <= kills; k++) {
  await sleep(minGap + random() * (maxGap - minGap))
  const victim = all[Math.floor(random() * all.length)]
  const down = random() < longDownShare ? maxDown + random() * (longDown - maxDown) : random() * maxDown
  const inc = victim.current
  if (inc.readyAt === null && Date.now() - inc.startedAt > READY_MS) {
    violations.push(`${victim.name} #${inc.number} was not ready ${READY_MS} ms after its start (hang)`)
  }
  await victim.kill()
  appendFileSync(join(dir, 'kills.log'), `${JSON.stringify({ ...victim.kills.at(-1), victim: victim.name, incarnation: inc.number, ready: inc.readyAt !== null, downMs: Math.round(down) })}\n`)
  await sleep(down)
  victim.start()
  if (k % 50 === 0) say(`  ${k} kills, ${((Date.now() - t0) / 1000).toFixed(0)} s`)
}

// The calm tail: everyone up and connected, the apps go on sending for --calm-ms.
const quiesceStart = Date.now()
for (const p of all) {
  await deadline(p.current.ready, READY_MS, `${p.name} restart`).catch((e) => violations.push(`${e.message} (hang)`))
}
await Promise.all(
  peers.map((p) => {
    const done = p.nextLine((l) => l.startsWith('{"connected"'), READY_MS, 'relay connection after the last kill')
    p.write('connected')
    return done.catch((e) => violations.push(e.message))
  }),
)
await sleep(calmMs)

// Quiescence: the apps stop sending, then every outbox, inbound buffer and relay mailbox must
// drain.
await Promise.all(
  peers.map((p) => {
    const done = p.nextLine((l) => l.startsWith('{"quiesced"'), READY_MS, 'quiesce')
    p.write('quiesce')
    return done.catch((e) => violations.push(e.message))
  }),
)

async function backlog() {
  const left = {}
  for (const p of peers) {
    left[`${p.name} outbox`] = count(p.files.storage, 'SELECT COUNT(*) AS n FROM outbox')
    left[`${p.name} inbound buffer`] = count(p.files.storage, 'SELECT COUNT(*) AS n FROM pending_inbound')
  }
  left['relay mailboxes'] = await relay.stored()
  return left
}
let left = await backlog()
while (Object.values(left).some((n) => n > 0)) {
  if (Date.now() - quiesceStart > quiesceMs) {
    violations.push(`not quiescent ${quiesceMs} ms after the last kill: ${JSON.stringify(left)}`)
    break
  }
  await sleep(250)
  left = await backlog()
}
const quiesceSec = (Date.now() - quiesceStart) / 1000

// Orderly shutdown, then the verdict from the files.
for (const p of peers) {
  const stopped = p.nextLine((l) => l.startsWith('{"stopped"'), READY_MS, 'stop')
  const exited = p.expectExit()
  p.write('stop')
  await stopped.catch((e) => violations.push(e.message))
  await deadline(exited, READY_MS, `${p.name} exit after stop`).catch((e) => violations.push(e.message))
}
for (const p of relay.processes.reverse()) {
  const exited = p.expectExit()
  p.current.child.kill('SIGTERM')
  await deadline(exited, READY_MS, `${p.name} exit after SIGTERM`).catch((e) => violations.push(e.message))
}
for (const p of all) {
  for (const e of p.unexpectedExits) violations.push(`${p.name} #${e.incarnation} exited by itself (${e.signal ?? `code ${e.code}`})`)
}

const result = verify({
  peers: peers.map((p) => ({ name: p.name, ...p.files, kills: p.kills })),
  kills: all.flatMap((p) => p.kills.map((k) => ({ ...k, victim: p.name }))),
  startedAt: t0,
})
violations.push(...result.violations)
const t = result.totals
const report = {
  seed,
  kills: { total: kills, ...Object.fromEntries(all.map((p) => [p.name, p.kills.length])) },
  messages: t.accepted,
  delivered: t.delivered,
  failed: t.failed,
  lost: t.lost,
  duplicates: t.duplicates,
  stuck: t.stuck,
  sendsCutByKill: t.sendsCut,
  acceptedButUnlogged: t.acceptedUnlogged,
  failedToPeer: t.failedToPeer,
  failedToPeerExcused: t.failedToPeerExcused,
  failedButReceived: t.failedButReceived,
  undisturbed: t.undisturbed,
  redeliveriesAbsorbed: t.redeliveriesAbsorbed,
  terminalEvents: {
    once: t.terminalOnce,
    seenAgainAfterKill: t.terminalReplayedAfterKill,
    firstSeenReplayed: t.terminalFirstSeenReplayed,
    lost: t.terminalLost,
  },
  receivedEvents: { logged: t.receivedEvents, cutByKill: t.receivedEventsCut },
  undecryptableAttempts: t.undecryptableAttempts,
  perPeer: result.perPeer,
  quiesceSec,
  durationSec: (Date.now() - t0) / 1000,
  violations,
}

// The command that replays this kill schedule: the given arguments, with the seed made explicit.
const rerun = [...(opt.seed === undefined ? ['--seed', String(seed)] : []), ...process.argv.slice(2)].join(' ')
if (opt.json) {
  console.log(JSON.stringify(report))
} else {
  const failed = Object.entries(t.failed).map(([reason, n]) => `${reason}: ${n}`).join(', ') || 'none'
  console.log(`
crash run, seed ${seed}: node scripts/crash-run.mjs ${rerun}
  kills survived     ${kills} (${all.map((p) => `${p.name} ${p.kills.length}`).join(', ')})
  messages accepted  ${t.accepted} (alice ${result.perPeer.alice.accepted}, bob ${result.perPeer.bob.accepted})
  delivered          ${t.delivered}, each exactly once in the recipient app's inbox
  failed             ${Object.values(t.failed).reduce((a, b) => a + b, 0)} (${failed}); ${t.failedToPeer} of them to the other app (${t.failedToPeerExcused} with a kill or a lost connection in their life); ${t.failedButReceived} of all failed were received
  undisturbed        ${t.undisturbed} messages to the other app had no kill and no lost connection in their life: each must be delivered
  lost               ${t.lost}
  duplicates         ${t.duplicates}
  sendMessage calls cut by a kill: ${t.sendsCut}, each followed by a kill of its process (${t.acceptedUnlogged} of them committed and were delivered or failed like any other)
  redeliveries the inbox's dedup key absorbed: ${t.redeliveriesAbsorbed}
  terminal events    ${t.terminalOnce} seen once; after a kill of the sender, ${t.terminalReplayedAfterKill} seen again (replayed), ${t.terminalFirstSeenReplayed} first seen as a replay; ${t.terminalLost} lost
  message_received   ${t.receivedEvents} logged, ${t.receivedEventsCut} cut by a kill of the recipient (message in its inbox)
  undecryptable      ${t.undecryptableAttempts} attempts (each recovered by the sender's re-sealed retry, or counted above)
  quiescence         ${quiesceSec.toFixed(1)} s after the last kill
  duration           ${report.durationSec.toFixed(1)} s
  ${violations.length === 0 ? 'no violations' : `${violations.length} VIOLATIONS:\n    ${violations.slice(0, 50).join('\n    ')}`}`)
}
if (violations.length === 0 && !opt.keep) {
  rmSync(dir, { recursive: true, force: true })
} else {
  say(`files kept in ${dir}`)
}
process.exitCode = violations.length === 0 ? 0 : 1

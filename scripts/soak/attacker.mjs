// One attack of `scripts/soak.mjs`, in a process of its own so that its work shares neither the
// honest clients' event loop nor another attack's. Forked with one JSON argument
// `{ attack, url, tokens, victims }`; runs until the parent sends `{ cmd: 'stop' }`, then answers
// `{ counts }` and exits. Each attack comes from a loopback address of its own (127.0.0.2 and up),
// as attackers on other hosts would: the honest clients connect from 127.0.0.1.
import { setPriority } from 'node:os'

import WebSocket from 'ws'

const { attack, url, tokens, victims } = JSON.parse(process.argv[2])
// Attackers stand in for other hosts: on this machine they take the CPU that nothing else wants,
// so what the soak measures is what they cost the relay, not what they cost themselves.
setPriority(19)
const counts = {}
const count = (what, n = 1) => {
  counts[what] = (counts[what] ?? 0) + n
}
let running = true

process.on('disconnect', () => process.exit(0))
process.on('message', ({ cmd }) => {
  if (cmd !== 'stop') return
  running = false
  // Open sockets end with the process; the relay sees them close.
  process.send({ counts }, () => process.exit(0))
})

/** A connection from `source`, resolved once open (or failed: then `null`). */
function connect(source) {
  return new Promise((resolve) => {
    const ws = new WebSocket(url, { localAddress: source, maxPayload: 2 ** 30 })
    ws.once('open', () => resolve(ws))
    ws.once('error', () => resolve(null))
    ws.once('close', () => resolve(null))
  })
}

const closed = (ws) => new Promise((resolve) => (ws.readyState === WebSocket.CLOSED ? resolve() : ws.once('close', resolve)))
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** A session of `account`, resolved once `Authenticated`, or `null` if refused. */
async function session(account, source) {
  const ws = await connect(source)
  if (ws === null) return null
  const authenticated = new Promise((resolve) => {
    ws.on('message', (data) => {
      const frame = JSON.parse(data)
      if (frame.type === 'Authenticated') resolve(ws)
      if (frame.type === 'AuthError') resolve(null)
    })
    ws.once('close', () => resolve(null))
  })
  ws.send(JSON.stringify({ type: 'Authenticate', token: tokens[account] }))
  return authenticated
}

/** Keeps 200 connections open that never authenticate. */
async function unauthenticated() {
  const open = new Set()
  while (running) {
    while (open.size < 200 && running) {
      const ws = await connect('127.0.0.2')
      if (ws === null) {
        count('unauthenticated refused at accept')
        await pause(20)
        continue
      }
      count('unauthenticated opened')
      open.add(ws)
      ws.once('close', () => open.delete(ws))
    }
    await pause(50)
  }
}

/** Guesses tokens, one connection after another. */
async function guesser() {
  while (running) {
    const ws = await connect('127.0.0.3')
    if (ws === null) {
      await pause(20)
      continue
    }
    ws.on('message', (data) => {
      if (JSON.parse(data).reason === 'too_many_attempts') count('guesses refused for the source')
    })
    ws.send(JSON.stringify({ type: 'Authenticate', token: `eyJhbGciOiJIUzI1NiJ9.${Math.random()}.guess` }))
    count('tokens guessed')
    await closed(ws)
  }
}

/** Opens with a frame of 1 MiB before authenticating. */
async function oversized() {
  const big = JSON.stringify({ type: 'Authenticate', token: 'x'.repeat(1 << 20) })
  while (running) {
    const ws = await connect('127.0.0.4')
    if (ws === null) {
      await pause(20)
      continue
    }
    ws.on('error', () => {})
    ws.send(big)
    count('oversized first frames')
    await closed(ws)
  }
}

/** Sends to the honest recipients and to a sink that never reads, as fast as it may. */
async function filler() {
  const content = 'x'.repeat(60 * 1024)
  while (running) {
    const ws = await session('mallory-fill', '127.0.0.5')
    if (ws === null) {
      await pause(200)
      continue
    }
    ws.on('message', (data) => {
      const frame = JSON.parse(data)
      if (frame.type === 'RateLimited') count('filler frames rate limited')
      else if (frame.type === 'MessageSent') count('filler frames stored')
      else if (frame.type === 'DeliveryError' || frame.type === 'Error') count(`filler refused: ${frame.reason ?? frame.code}`)
    })
    let n = 0
    while (running && ws.readyState === WebSocket.OPEN) {
      const recipient = n % 4 === 0 ? 'mallory-sink' : victims[n % victims.length]
      ws.send(JSON.stringify({ type: 'SendMessage', recipient, content, message_id: `fill-${process.pid}-${n++}` }))
      count('filler frames sent')
      // Let the socket drain now and then, or this process would only buffer.
      if (ws.bufferedAmount > 4 << 20) await pause(5)
      else if (n % 64 === 0) await pause(0)
    }
  }
}

/** Watches thousands of identifiers, unwatches them, again and again. */
async function watcher() {
  const users = Array.from({ length: 4096 }, (_, i) => `watched-${i}`)
  while (running) {
    const ws = await session('mallory-watch', '127.0.0.6')
    if (ws === null) {
      await pause(200)
      continue
    }
    ws.on('message', (data) => {
      if (JSON.parse(data).type === 'RateLimited') count('watches rate limited')
    })
    while (running && ws.readyState === WebSocket.OPEN) {
      ws.send(JSON.stringify({ type: 'WatchPresence', users }))
      ws.send(JSON.stringify({ type: 'UnwatchPresence', users }))
      count('watch frames of 4096', 2)
      await pause(5)
    }
  }
}

/** Logs one account in and out as fast as the relay lets it. */
async function churn() {
  while (running) {
    const ws = await session('mallory-churn', '127.0.0.7')
    if (ws === null) {
      count('churn logins refused')
      await pause(50)
      continue
    }
    count('churn logins')
    ws.close()
    await closed(ws)
  }
}

/** Authenticates and never reads: what is sent to it must not pile up in the relay. */
async function sink() {
  while (running) {
    const ws = await session('mallory-sink', '127.0.0.8')
    if (ws === null) {
      await pause(200)
      continue
    }
    ws._socket.pause()
    count('sink sessions')
    await closed(ws)
  }
}

const attacks = { unauthenticated, guesser, oversized, filler, watcher, churn, sink }
await attacks[attack]()

// The connection load of `bench/compare.mjs`'s memory measure: plain `ws` connections that
// authenticate to a relay (either one: the frames are the same) and then stay idle or keep
// sending. Forked with one JSON argument `{ url }` and driven over IPC:
//
//   { cmd: 'open', tokens, window? }  opens one authenticated connection per token and answers
//       once all are up. With `window`, connections 2k and 2k+1 each keep `window` messages to
//       the other awaiting `MessageSent`, releasing what they receive, and the answer waits until
//       every one of them has had a send answered.
//   { cmd: 'close' }  closes every connection.
//   { cmd: 'stop' }  exits.
import WebSocket from 'ws'

const { url } = JSON.parse(process.argv[2])
const OPENING_AT_ONCE = 100

process.on('disconnect', () => process.exit(0))

const open = new Set()

function fail(e) {
  process.send({ error: e.stack ?? String(e) }, () => process.exit(1))
}

function connect({ token }) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { perMessageDeflate: false })
    ws.on('open', () => ws.send(JSON.stringify({ type: 'Authenticate', token, client_capabilities: ['mailbox_v1'] })))
    ws.on('error', reject)
    ws.once('message', (data) => {
      const frame = JSON.parse(data)
      if (frame.type !== 'Authenticated') return reject(new Error(`not authenticated: ${data}`))
      // Starts our relay's drain at once (docs/protocol.md, Drain); the reference ignores it.
      ws.send(JSON.stringify({ type: 'AckUpTo', seq: 0 }))
      open.add(ws)
      resolve({ ws, account: frame.username })
    })
  })
}

async function connectAll(tokens) {
  const connections = []
  for (let i = 0; i < tokens.length; i += OPENING_AT_ONCE) {
    connections.push(...(await Promise.all(tokens.slice(i, i + OPENING_AT_ONCE).map((token) => connect({ token })))))
  }
  return connections
}

/** Keeps `window` messages from `from` to `to` awaiting their answer; resolves at the first answer. */
function keepSending(from, to, window) {
  return new Promise((resolve) => {
    let sent = 0
    const send = () => {
      const n = sent++
      from.ws.send(JSON.stringify({ type: 'SendMessage', recipient: to.account, content: `payload ${n}`, message_id: `${from.account}-${n}` }))
    }
    from.ws.on('message', (data) => {
      const frame = JSON.parse(data)
      if (frame.type === 'MessageSent') {
        resolve()
        if (from.ws.readyState === WebSocket.OPEN) send()
      } else if (frame.type === 'MessageReceived' && frame.seq !== undefined) {
        from.ws.send(JSON.stringify({ type: 'Ack', seq: frame.seq }))
      } else if (frame.type !== 'MessageReceived' && frame.type !== 'DrainComplete') {
        fail(new Error(`unexpected frame: ${data}`))
      }
    })
    for (let i = 0; i < window; i++) send()
  })
}

process.on('message', async ({ cmd, tokens, window }) => {
  try {
    if (cmd === 'open') {
      const connections = await connectAll(tokens)
      if (window !== undefined) {
        const sending = []
        for (let i = 0; i + 1 < connections.length; i += 2) {
          sending.push(keepSending(connections[i], connections[i + 1], window), keepSending(connections[i + 1], connections[i], window))
        }
        await Promise.all(sending)
      }
    } else if (cmd === 'stop') {
      process.exit(0)
    } else if (cmd === 'close') {
      await Promise.all(
        [...open].map(
          (ws) =>
            new Promise((resolve) => {
              ws.once('close', resolve)
              ws.close()
            }),
        ),
      )
      open.clear()
    } else throw new Error(`unknown command ${cmd}`)
    process.send({ result: true })
  } catch (e) {
    fail(e)
  }
})
process.send({ ready: true })

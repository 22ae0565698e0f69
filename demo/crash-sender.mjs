// The sender the demo kills: a device whose network is down (its relay address answers
// nothing). It prints the message id once `sendMessage` resolved — the message is durable from
// that moment — and waits to be killed.
import { Protocol } from '../js/index.js'

const protocol = new Protocol({
  appId: 'demo',
  storage: { path: process.env.DEMO_DB },
  transports: { internet: { url: process.env.DEMO_URL, authToken: process.env.DEMO_TOKEN } },
})
await protocol.start()
const id = await protocol.sendMessage(process.env.DEMO_TO, process.env.DEMO_CONTENT)
process.stdout.write(`${id}\n`)

// The receiving process of the end-to-end benchmark: prints one line once connected, its
// address; with BENCH_ENCRYPTION=1 every message reaches it sealed.
import { Protocol } from '../js/index.js'

const bob = new Protocol({
  appId: 'bench',
  storage: { path: process.env.BENCH_DB },
  transports: { internet: { url: process.env.BENCH_URL, authToken: process.env.BENCH_TOKEN } },
  encryption: { enabled: process.env.BENCH_ENCRYPTION === '1' },
})
bob.onEvent((e) => {
  if (e.type === 'internet_status_changed' && e.connected) process.stdout.write(`${bob.localAddress()}\n`)
})
process.once('SIGTERM', async () => {
  await bob.stop()
})
await bob.start()

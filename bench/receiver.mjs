// The receiving process of the end-to-end benchmark: prints one line once connected.
import { Protocol } from '../js/index.js'

const bob = new Protocol({
  appId: 'bench',
  storage: { path: process.env.BENCH_DB },
  transports: { internet: { url: process.env.BENCH_URL, authToken: process.env.BENCH_TOKEN } },
})
bob.onEvent((e) => {
  if (e.type === 'internet_status_changed' && e.connected) process.stdout.write('ready\n')
})
process.once('SIGTERM', async () => {
  await bob.stop()
})
await bob.start()

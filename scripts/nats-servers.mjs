// Three NATS servers with JetStream, routed to each other, on loopback ports the system picks:
// what `npm run cluster` and the crash runs' `--cluster` start (docs/cluster.md). Writes each
// server's config into `dir`; starting and stopping them is the caller's.
import { spawnSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

/** A port free on 127.0.0.1 now. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      server.close(() => resolve(port))
    })
  })
}

/** The `nats-server` binary, installed first if needed (scripts/install-nats.mjs). */
export function natsBinary() {
  const script = fileURLToPath(new URL('./install-nats.mjs', import.meta.url))
  const result = spawnSync(process.execPath, [script], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] })
  if (result.status !== 0) throw new Error('installing nats-server failed')
  return result.stdout.trim()
}

/**
 * Configures three servers named n0, n1, n2 of the NATS cluster `name`, their stores under `dir`:
 * `[{ name, config, url, monitor }]`.
 */
export async function configureServers(dir, name) {
  const ports = []
  for (let i = 0; i < 3; i++) ports.push({ client: await freePort(), route: await freePort(), monitor: await freePort() })
  const routes = ports.map((p) => `"nats-route://127.0.0.1:${p.route}"`).join(', ')
  return ports.map((p, i) => {
    const config = join(dir, `n${i}.conf`)
    // A reservation, not a use of the disk: the journal's default byte cap (8 GiB) must fit it.
    writeFileSync(
      config,
      `server_name: n${i}\nlisten: "127.0.0.1:${p.client}"\nhttp: "127.0.0.1:${p.monitor}"\n` +
        `jetstream { store_dir: ${JSON.stringify(join(dir, `n${i}`))}, max_file_store: 10GB }\n` +
        `cluster { name: ${name}, listen: "127.0.0.1:${p.route}", routes: [${routes}] }\n`,
    )
    return { name: `n${i}`, config, url: `nats://127.0.0.1:${p.client}`, monitor: p.monitor }
  })
}

// Builds the Node-API addon from source with the machine's Rust toolchain (run by `npm ci`
// through the `prepare` script). `--debug` skips optimisation for a faster edit-build loop.
import { spawnSync } from 'node:child_process'

const debug = process.argv.includes('--debug')
const args = ['napi', 'build', '--platform', '--js', 'index.js', '--dts', 'index.d.ts']
if (!debug) args.push('--release')

const result = spawnSync('npx', args, { stdio: 'inherit', shell: process.platform === 'win32' })
if (result.error) throw result.error
process.exit(result.status ?? 1)

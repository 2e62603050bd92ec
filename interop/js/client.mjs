// Interop client: the published @openfeature/flagd-provider, in-process resolver,
// syncing from flagd-proxy over gRPC.
//
// Environment:
//   FLAGD_HOST, FLAGD_PORT, FLAGD_SOURCE_SELECTOR, FLAGD_TLS (true/false),
//   FLAGD_SERVER_CERT_PATH (CA file, TLS only), INTEROP_FLAG_KEY (a string flag),
//   INTEROP_SOCKET_PATH (a unix socket to sync from instead of FLAGD_HOST:FLAGD_PORT),
//   INTEROP_DEBUG (any value: provider debug logging on stderr),
//   INTEROP_EVENTS (`1`: also print every provider event, see below).
//
// Stdout protocol: `READY` once the provider is ready, then `VALUE <value>` each
// time the evaluated value differs from the last printed one. With INTEROP_EVENTS=1,
// also `EVENT <READY|STALE|ERROR|CHANGED> <unix millis>` for every provider event as
// it is emitted. Everything else goes to stderr. The process exits when stdin reaches EOF.

import { existsSync } from 'node:fs';
import { OpenFeature, ProviderEvents } from '@openfeature/server-sdk';
import { FlagdProvider } from '@openfeature/flagd-provider';

const DEFAULT_VALUE = '<default>';
const POLL_MS = 100;

function fail(message) {
  process.stderr.write(`interop-js: ${message}\n`);
  process.exit(2);
}

function required(name) {
  const value = process.env[name];
  if (value === undefined || value === '') {
    fail(`environment variable ${name} is required`);
  }
  return value;
}

function log(level, args) {
  const text = args
    .map((a) => (a instanceof Error ? a.stack || a.message : typeof a === 'string' ? a : JSON.stringify(a)))
    .join(' ');
  process.stderr.write(`interop-js [${level}] ${text}\n`);
}

const debug = !!process.env.INTEROP_DEBUG;
const logger = {
  error: (...a) => log('error', a),
  warn: (...a) => log('warn', a),
  info: (...a) => log('info', a),
  debug: (...a) => {
    if (debug) log('debug', a);
  },
};

const host = required('FLAGD_HOST');
const port = Number(required('FLAGD_PORT'));
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
  fail(`FLAGD_PORT is not a port: ${process.env.FLAGD_PORT}`);
}
const selector = process.env.FLAGD_SOURCE_SELECTOR || '';
const tls = (process.env.FLAGD_TLS || 'false').toLowerCase() === 'true';
const certPath = process.env.FLAGD_SERVER_CERT_PATH || undefined;
const flagKey = required('INTEROP_FLAG_KEY');
const socketPath = process.env.INTEROP_SOCKET_PATH || undefined;
const events = process.env.INTEROP_EVENTS === '1';

// The provider silently falls back to the system roots when certPath does not exist;
// refuse that here so a wrong path is not mistaken for a server problem.
if (tls && certPath && !existsSync(certPath)) {
  fail(`FLAGD_SERVER_CERT_PATH does not exist: ${certPath}`);
}

let stopped = false;
function shutdown(code) {
  if (stopped) return;
  stopped = true;
  // Do not wait for the provider to close cleanly: the parent is gone or asked us to stop.
  process.exit(code);
}

process.stdin.on('data', () => {});
process.stdin.on('end', () => shutdown(0));
process.stdin.on('error', () => shutdown(0));
process.on('SIGTERM', () => shutdown(0));
process.on('SIGINT', () => shutdown(0));
process.stdout.on('error', () => shutdown(0));

OpenFeature.setLogger(logger);

const provider = new FlagdProvider(
  {
    resolverType: 'in-process',
    host,
    port,
    socketPath,
    selector,
    tls,
    certPath: tls ? certPath : undefined,
  },
  logger,
);

const client = OpenFeature.getClient();

let announced = false;
let lastPrinted;

async function poll() {
  if (stopped) return;
  try {
    const value = await client.getStringValue(flagKey, DEFAULT_VALUE);
    if (value !== lastPrinted) {
      lastPrinted = value;
      process.stdout.write(`VALUE ${value}\n`);
    }
  } catch (err) {
    logger.error('evaluation failed:', err);
  }
  setTimeout(poll, POLL_MS);
}

function onReady() {
  if (announced) return;
  announced = true;
  process.stdout.write('READY\n');
  poll();
}

// Fires when the provider becomes ready, including after a failed first connection
// followed by a successful reconnect.
client.addHandler(ProviderEvents.Ready, onReady);
client.addHandler(ProviderEvents.Error, (details) => logger.warn('provider error event:', details?.message ?? ''));
client.addHandler(ProviderEvents.Stale, (details) => logger.warn('provider stale event:', details?.message ?? ''));
if (events) {
  const record = (name) => () => process.stdout.write(`EVENT ${name} ${Date.now()}\n`);
  client.addHandler(ProviderEvents.Ready, record('READY'));
  client.addHandler(ProviderEvents.Stale, record('STALE'));
  client.addHandler(ProviderEvents.Error, record('ERROR'));
  client.addHandler(ProviderEvents.ConfigurationChanged, record('CHANGED'));
}

OpenFeature.setProviderAndWait(provider).then(
  () => onReady(),
  (err) => logger.warn('initial connection failed, the provider keeps retrying:', err?.message ?? String(err)),
);

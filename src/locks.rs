//! Locks that keep working after a panic elsewhere: the data behind every lock of the proxy
//! stays consistent at each statement (nothing is left half-updated across a call that may
//! panic), so a poisoned lock is taken as it is rather than spreading one panic to every task.
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `mutex.lock()`, poisoned or not.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `lock.read()`, poisoned or not.
pub fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `lock.write()`, poisoned or not.
pub fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_as_it_is() {
        let mutex = Mutex::new(1);
        let rw = RwLock::new(2);
        let _ = std::panic::catch_unwind(|| {
            let _m = mutex.lock();
            let _w = rw.write();
            panic!("poison both");
        });
        assert!(mutex.is_poisoned() && rw.is_poisoned());
        *lock(&mutex) += 1;
        *write(&rw) += 1;
        assert_eq!((*lock(&mutex), *read(&rw)), (2, 3));
    }
}

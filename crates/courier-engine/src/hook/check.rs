//! The pipeline's own consistency checks, run by the engine's test harness.

use super::*;

#[cfg(test)]
impl HookPipeline {
    pub(crate) fn keys(&self) -> impl Iterator<Item = &InboundKey> + '_ {
        self.index.keys()
    }

    /// Every row is in exactly the batch or group its place says; the byte and expiry indexes
    /// agree with the rows.
    pub(crate) fn check(&self) {
        let mut seen: HashMap<RowId, Place> = HashMap::new();
        let mut note = |id: RowId, place: Place| {
            assert!(seen.insert(id, place).is_none(), "row {id} in two batches");
        };
        if let Some(open) = &self.open {
            assert!(!open.members.is_empty(), "an empty open batch");
            let bytes: usize = open.members.iter().map(|(id, _)| self.rows[id].bytes).sum();
            assert_eq!(bytes, open.bytes, "open batch bytes");
            assert!(
                open.members.len() < self.batch_max_messages(),
                "open batch over the count"
            );
            assert!(self.draining.is_some(), "an open batch outside a drain");
            for (id, _) in &open.members {
                note(*id, Place::Open);
            }
        }
        for batch in &self.ready {
            assert!(!batch.is_empty(), "an empty ready batch");
            for (id, _) in batch {
                note(*id, Place::Ready);
            }
        }
        if let Some(offered) = &self.with_hook {
            for (id, _) in &offered.members {
                note(*id, Place::WithHook);
            }
        }
        for (group, ids) in &self.waiting {
            assert!(!ids.is_empty(), "an empty retry group");
            for id in ids {
                note(*id, Place::Waiting(*group));
            }
        }
        assert_eq!(seen.len(), self.rows.len(), "rows outside the pipeline");
        let mut bytes = 0;
        for (id, row) in &self.rows {
            assert_eq!(seen.get(id), Some(&row.place), "row {id} misplaced");
            assert_eq!(self.index.get(&row.pending.key), Some(id));
            bytes += row.bytes;
            let indexed = self
                .expiries
                .contains(&(self.expires_at(row.pending.received_at), *id));
            assert_eq!(
                indexed,
                row.place != Place::WithHook,
                "expiry index of row {id}"
            );
        }
        assert_eq!(self.index.len(), self.rows.len());
        assert_eq!(
            self.expiries.len(),
            self.rows.len() - self.with_hook.as_ref().map_or(0, |o| o.members.len())
        );
        assert_eq!(bytes, self.bytes, "buffer bytes");
        assert!(self.to_buffer.is_empty(), "buffered rows left unwritten");
    }
}

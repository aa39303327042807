use super::{NoWindowBlock, WindowPool, WindowTable};

#[test]
fn blocks_wholly_before_the_window_go_back_and_the_window_stays() {
    // Window 5, blocks of 4: after 12 cells the next row (cell 12) reads
    // cells 8..=12, so blocks 0 and 1 (cells 0..8) go back.
    let mut pool = WindowPool::new(4, 4, 5);
    let mut table = WindowTable::default();
    pool.reserve(&mut table, 13).expect("room");
    assert_eq!((table.table.clone(), pool.used()), (vec![0, 1, 2, 3], 4));
    pool.slide(&mut table, 11);
    assert_eq!(pool.used(), 3, "cell 11's window starts at cell 7, in block 1");
    pool.slide(&mut table, 12);
    assert_eq!((table.table.clone(), table.live_blocks(), pool.used()), (vec![0, 0, 2, 3], 2, 2));
    // Sliding back (a shorter kept length) returns nothing and takes nothing.
    pool.slide(&mut table, 3);
    assert_eq!(pool.used(), 2);
    // The freed blocks serve the next cells.
    pool.reserve(&mut table, 20).expect("room");
    assert_eq!(table.table, vec![0, 0, 2, 3, 1]);
    assert_eq!(pool.reserve(&mut table, 40), Err(NoWindowBlock { n_blocks: 4 }));
    pool.release(table);
    assert_eq!(pool.used(), 0);
}

#[test]
fn rejected_drafts_find_their_window_whole() {
    // Window 8, blocks of 4, passes of up to 7 rows: 30 cells kept, then a
    // verification pass writes a token and six drafts (cells 30..37) and
    // none is accepted: 31 cells are kept, and the next row (cell 31)
    // reads cells 24..=31. Sliding by the 37 cells written would have
    // freed block 6 (cells 24..28).
    let (window, block_tokens, rows) = (8, 4, 7);
    let mut pool = WindowPool::new(WindowPool::blocks_per_sequence(window, block_tokens, rows), block_tokens, window);
    let mut table = WindowTable::default();
    let mut cells = 0;
    while cells < 30 {
        let pass = rows.min(30 - cells);
        pool.reserve(&mut table, cells + pass).expect("a window and a pass fit");
        cells += pass;
        pool.slide(&mut table, cells);
    }
    pool.reserve(&mut table, 37).expect("the verification pass fits");
    pool.slide(&mut table, 31);
    assert_eq!(table.live, 24 / block_tokens, "the block holding cell 24 is still the sequence's");
    assert_eq!((table.table.len(), table.live_blocks()), (10, 4));
}

/// Gemma 3's shape: five window layers to one global, a window of 1024;
/// blocks of 16 cells, prompts prefilled in passes of 512 rows (the
/// server's default batch) and replies decoded a row a pass, turn after
/// turn, to 32k cells.
#[test]
fn a_32k_conversation_on_a_gemma3_shaped_model_keeps_under_a_quarter_of_all_global_kv() {
    let (window, block_tokens, rows, context) = (1024, 16, 512, 32 * 1024);
    let (n_window_layers, n_global_layers) = (5, 1);
    let per_sequence = WindowPool::blocks_per_sequence(window, block_tokens, rows);
    let mut pool = WindowPool::new(per_sequence, block_tokens, window);
    let mut table = WindowTable::default();
    let (mut cells, mut peak, mut turn) = (0, 0, 0);
    while cells < context {
        // A turn: a 1200-token message, then a 300-token reply.
        let passes = (0..1200).step_by(rows).map(|start| rows.min(1200 - start)).chain(std::iter::repeat_n(1, 300));
        for pass in passes {
            let pass = pass.min(context - cells);
            if pass == 0 {
                break;
            }
            pool.reserve(&mut table, cells + pass).expect("the sized pool holds a sequence");
            peak = peak.max(pool.used());
            cells += pass;
            pool.slide(&mut table, cells);
        }
        turn += 1;
    }
    assert_eq!((cells, turn), (context, 22));
    // Block-layers held at the peak: every cell of the global layer, the
    // windows of the others.
    let global_blocks = context / block_tokens;
    assert_eq!((peak, per_sequence), (97, 97));
    let windowed = global_blocks * n_global_layers + peak * n_window_layers;
    let all_global = global_blocks * (n_global_layers + n_window_layers);
    assert_eq!((windowed, all_global), (2048 + 485, 12288));
    assert!(windowed * 4 <= all_global, "{windowed} of {all_global} block-layers");
}

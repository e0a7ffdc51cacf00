// A `break` only some threads of a team take, in a loop with a barrier: the others would
// wait at the barrier for ever.
#[offload::kernel(teams = 4)]
pub fn skip(team: usize, thread: usize, x: &[u32], y: &mut [u32]) {
    for k in 0..2usize {
        if thread == 0 {
            break;
        }
        offload::barrier();
        y[team * 4 + thread] = x[team * 4 + thread] + k as u32;
    }
}

fn main() {}

"""The objective ``F(X w + b) + penalty(w)``: datafits (losses, their conjugates and dual
points), penalties (the elastic net) and the duality gap built from both."""

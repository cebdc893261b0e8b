"""Camera geometry, below camerad and the model runtime alike: the sensors and the road's projection (camera.py), the
model frames and the warps into them (model.py). openpilot's frames: device x forward, y right, z down; view x right,
y down, z forward; the calibrated road frame is the device frame rotated by liveCalibration.rpyCalib, the road at
z = camera height. Pixel (i, j) sits at (x=i, y=j); a camera's principal point is (w/2, h/2)."""
